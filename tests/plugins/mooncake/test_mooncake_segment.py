"""The segment holder of the benchmarks (``kvcr_policy_mooncake.segment``) with real Mooncake.

``--prefault`` writes the whole segment once before the holder announces it, and leaves it
empty: the pages stored afterwards find all of its room. Without the flag the holder only
joins, as Mooncake's own clients do.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from kvcr_policy.geometry import PoolGeometry
from tests.plugins.mooncake.mooncake_helpers import need_mooncake, pipeline_on
from tests.support.pools import pages_of, pool_buffer, token_indices

pytestmark = [pytest.mark.mooncake, pytest.mark.slow]

SEGMENT = 32 << 20
# 768 pages of 32 KiB: 24 MiB, three quarters of the segment. Were the prefault's objects
# left behind, the segment would have no room for them.
GEO = PoolGeometry("kv", "page_first", 2, 4, 64, "float16", 16, 16 * 768)


@contextmanager
def holding(prefault: bool) -> Iterator[tuple[Any, Any]]:
    """A master and one segment holder of ``SEGMENT`` bytes on it."""
    need_mooncake()
    from kvcr_policy_mooncake.master import MasterProcess
    from kvcr_policy_mooncake.segment import SegmentProcess

    with MasterProcess() as master:
        holder = SegmentProcess(master.address, SEGMENT, prefault=prefault)
        try:
            yield master, holder
        finally:
            holder.stop()


def test_a_prefaulted_segment_was_written_whole_and_keeps_all_its_room() -> None:
    with holding(prefault=True) as (master, holder):
        assert holder.info["prefaulted_bytes"] == SEGMENT, holder.info
        assert holder.info["prefault_s"] >= 0
        buffer = pool_buffer(GEO)
        pages = pages_of(buffer, GEO)
        count = pages.shape[1]
        keys = [f"room-{i}" for i in range(count)]
        with pipeline_on(master) as pipeline:
            pipeline.register_pool("kv", GEO, buffer)
            indices = token_indices(range(count), GEO.page_size)
            assert pipeline.set(keys, indices) == [True] * count
            expected = pages.copy()
            pages[:] = 0
            assert pipeline.get(keys, indices) == [True] * count
            assert np.array_equal(pages, expected)


def test_without_prefault_the_holder_only_joins() -> None:
    with holding(prefault=False) as (_, holder):
        assert set(holder.info) == {"segment", "segment_bytes"}
        assert holder.info["segment_bytes"] == SEGMENT
