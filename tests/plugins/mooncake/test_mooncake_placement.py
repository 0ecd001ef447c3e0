"""Placement options drive Mooncake's own controls: ``replicas`` and ``preferred_segment`` go
with every put (``ReplicateConfig``), checked by what survives a segment's death.

Two segment processes, A and B; the pipeline contributes none. Killing A loses the pages that
lived only in A's segment; with ``preferred_segment`` = B none were there, and with two replicas
every page also lives in the other segment (readable once the master has dropped A, after its
``client_ttl``, 2 s here).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.plugins.mooncake.mooncake_helpers import GEO, need_mooncake, pipeline_on
from tests.support.pools import pages_of, pool_buffer, token_indices
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.mooncake, pytest.mark.slow]

N = 24


@pytest.fixture
def two_segments() -> Iterator[tuple[Any, Any, Any]]:
    need_mooncake()
    from kvcr_policy_mooncake.master import MasterProcess
    from kvcr_policy_mooncake.segment import SegmentProcess

    with MasterProcess(args=["--client_ttl=2"]) as master:
        a = SegmentProcess(master.address, 32 << 20)
        b = SegmentProcess(master.address, 32 << 20)
        try:
            yield master, a, b
        finally:
            a.stop()
            b.stop()


def restore(pipeline: Any, keys: list[str], buffer: np.ndarray) -> tuple[list[bool], bool]:
    pages = pages_of(buffer, GEO)
    expected = pages[:, :N].copy()
    pages[:, N : 2 * N] = 0
    got = pipeline.get(keys, token_indices(range(N, 2 * N), GEO.page_size))
    exact = all(np.array_equal(pages[:, N + i], expected[:, i]) for i, ok in enumerate(got) if ok)
    return got, exact


def test_preferred_segment_places_every_page_there(two_segments: tuple[Any, Any, Any]) -> None:
    master, a, b = two_segments
    buffer = pool_buffer(GEO)
    keys = [f"pref-{i}" for i in range(N)]
    with pipeline_on(master, backend__options__preferred_segment=b.segment) as pipeline:
        pipeline.register_pool("kv", GEO, buffer)
        assert pipeline.stats().transport["preferred_segment"] == b.segment
        assert pipeline.set(keys, token_indices(range(N), GEO.page_size)) == [True] * N
        a.kill()  # none of the pages lived there
        got, exact = restore(pipeline, keys, buffer)
        assert got == [True] * N and exact


def test_two_replicas_survive_the_death_of_one_segment(two_segments: tuple[Any, Any, Any]) -> None:
    from kvcr_policy_mooncake.objects import layout_digest

    master, a, _ = two_segments
    buffer = pool_buffer(GEO, 2)
    keys = [f"twice-{i}" for i in range(N)]
    with pipeline_on(master, backend__options__replicas=2) as pipeline:
        pipeline.register_pool("kv", GEO, buffer)
        assert pipeline.set(keys, token_indices(range(N), GEO.page_size)) == [True] * N
        store = pipeline.backend.client.store  # type: ignore[attr-defined]
        objects = [f"kv@{layout_digest(GEO)}/{key}" for key in keys]
        assert [len(store.get_replica_desc(o)) for o in objects] == [2] * N
        a.kill()

        def all_read() -> bool:
            got, exact = restore(pipeline, keys, buffer)
            assert exact
            return got == [True] * N

        wait_until(all_read, "every page read back with two replicas", 15, every=0.5)
