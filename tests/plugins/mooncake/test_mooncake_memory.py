"""``stats().memory`` counts the segment a Mooncake client contributes to the store: that memory
is this process's, whatever pools it registers (one segment per client, counted once)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.plugins.mooncake.mooncake_helpers import GEO, pipeline_on

pytestmark = [pytest.mark.mooncake, pytest.mark.slow]


@pytest.mark.parametrize("segment", [0, 32 << 20])
def test_the_contributed_segment_counts_in_the_pipeline_s_memory(master: Any, segment: int) -> None:
    with pipeline_on(master, backend__options__segment_bytes=segment) as pipeline:
        pipeline.register_pool("kv", GEO, np.zeros(GEO.shape, dtype=np.float16))
        pipeline.register_pool("kv2", GEO, np.zeros(GEO.shape, dtype=np.float16))
        stats = pipeline.stats()
    assert stats.transport["segment_bytes"] == segment
    assert stats.memory["tier_bytes"] == segment  # once, not once per pool
