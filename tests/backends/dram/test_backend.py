"""The dram backend with a transport that asks for whole tier slots (``whole_slots``), the
layout the cuda transport's staging ring uses. The cuda transport needs a GPU, so here a
memory transport asks for it: the same backend data path, with numpy copies instead of CUDA
ones."""

from __future__ import annotations

import numpy as np
import pytest

from kvcr_policy.backends.dram.transports.base import CopyBatch
from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from tests.support.pipelines import (
    LAYOUT_CASES,
    LAYOUT_IDS,
    Build,
    build,
    geometry,
    keep_switch_interval,
)
from tests.support.pools import P, keys_of, pages_of, random_buffer, token_indices

__all__ = ["build", "keep_switch_interval"]  # fixtures


class WholeSlots(MemoryTransport):
    """The memory transport, asking the backend for whole slots; keeps every batch."""

    whole_slots = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[CopyBatch] = []

    def copy(self, batch: CopyBatch) -> None:
        self.seen.append(batch)
        super().copy(batch)


@pytest.mark.parametrize(("layout", "mla"), LAYOUT_CASES, ids=LAYOUT_IDS)
def test_whole_slot_tier_round_trips_scattered_pages(build: Build, layout: str, mla: bool) -> None:
    geo = geometry(layout, mla=mla)
    buffer = random_buffer(geo, np.random.default_rng(7), "numpy-float16")
    transport = WholeSlots()
    pipeline = build("throughput", {"batching.read_batch_pages": 4}, transport=transport)
    pipeline.register_pool("kv", geo, buffer)
    stored, restored = [5, 3, 12, 9, 15, 0, 7], [1, 2, 4, 6, 8, 10, 11]
    keys = keys_of("k", len(stored))
    assert pipeline.set(keys, token_indices(stored, P)) == [True] * len(stored)
    # Each page went into one slot whole: its bytes one contiguous run of the tier.
    for batch in transport.seen:
        d = batch.descriptors
        for page in np.unique(d.page):
            mine = d.page == page
            start, end = d.dst[mine].min(), (d.dst[mine] + d.length[mine]).max()
            assert start % geo.page_bytes == 0
            assert end - start == d.length[mine].sum() == geo.page_bytes
    view = pages_of(buffer, geo)
    expected = view[:, stored].copy()
    view[:, restored] = 0
    assert pipeline.get(keys, token_indices(restored, P)) == [True] * len(restored)
    assert np.array_equal(view[:, restored], expected)
    assert np.array_equal(view[:, stored], expected)  # the stored pages were only read
