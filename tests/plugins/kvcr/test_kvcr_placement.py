"""Placement and claims on the ``kvcr`` backend: KVCR's local DRAM is the region the configured
placement opened (pre-faulted, huge-page advice, NUMA policy, audited); a read holds KVCR's own
claims (``fetch`` handles, then ``release``) so nothing it reads is evicted or replaced; deleted
and cleared keys never come back and their blocks are evicted first; G3 files hold what DRAM
cannot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy.cli import main
from kvcr_policy.geometry import PoolGeometry
from tests.plugins.kvcr.kvcr_helpers import kvcr_of, pool_tier, stored
from tests.support.pools import P, fresh_keys, geometry, pages_of, pool_buffer, token_indices

PLACED = """
[placement]
prefault = true
huge_pages = "prefer"
numa_policy = "bind"
numa_nodes = [0]
"""


def test_kvcr_keeps_its_pages_in_the_region_the_placement_opened(
    kvcr_pipeline: Any, kvcr_profile: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    pipeline = kvcr_pipeline(PLACED, placement__capacity_bytes="4MiB")
    geo, buffer, _ = stored(pipeline, n=12)
    region = pool_tier(pipeline).region
    assert region.name == "kvcr:kv"
    audit = pipeline.audit()["kv"]
    assert audit["name"] == "kvcr:kv" and audit["state"] == "open"
    assert audit["prefaulted"] and audit["huge_pages_requested"] == "prefer"
    assert audit["numa_policy_obtained"] == "bind" and audit["numa_nodes_obtained"] == [0]
    assert audit["bytes"] == 4 * 2**20 // geo.page_bytes * geo.page_bytes  # whole pages
    # KVCR wrote every stored fragment into this region (one element per fragment).
    elements = {row.tobytes() for row in region.array.reshape(-1, geo.fragment_bytes)}
    fragments = pages_of(buffer, geo)[:, :12].reshape(-1, geo.fragment_bytes)
    assert all(f.tobytes() in elements for f in fragments)
    # `kvcr-policy audit` opens a region exactly as the profile places KVCR's.
    profile = kvcr_profile(PLACED, name="placed.toml")
    assert main(["audit", "--profile", str(profile), "--size", "4MiB", "--format", "json"]) is None
    reported = json.loads(capsys.readouterr().out)["audit"]
    for key in ("prefaulted", "huge_pages_requested", "numa_policy_obtained", "numa_mode"):
        assert reported[key] == audit[key]
    pool = pool_tier(pipeline)
    pipeline.close()
    closed = pool.audit()  # the region's own audit (Pipeline.audit() refuses after close)
    assert closed["state"] == "closed" and not closed["leaked"]


def _recorded_releases(kvcr: Any) -> list[int]:
    released: list[int] = []
    original = kvcr.release

    def release(handles: Any) -> Any:
        released.extend(int(h) for h in handles)
        return original(handles)

    kvcr.release = release
    return released


def test_a_read_holds_kvcr_claims_so_nothing_it_reads_is_evicted(kvcr_pipeline: Any) -> None:
    """A full tier; while a restore runs (after its first batch) a store of new keys needs
    evictions and gets none: KVCR's claims from the read's fetch hold every block until the
    read releases exactly those handles; afterwards the same store evicts."""
    pipeline = kvcr_pipeline(
        placement__capacity_bytes=8 * geometry().page_bytes, batching__read_batch_pages=2
    )
    geo, buffer, keys = stored(pipeline, n=8)
    runner = pool_tier(pipeline).runner
    released = _recorded_releases(kvcr_of(pipeline))
    view = pages_of(buffer, geo)
    expected = view[:, :8].copy()
    intruders = fresh_keys(4)
    during: list[Any] = []

    def on_ready(count: int) -> None:
        if not during:
            view[:, 40:44] = 0xA5
            during.append((runner.claims, pipeline.set(intruders, token_indices(range(40, 44), P))))

    view[:, 20:28] = 0
    assert pipeline.get(keys, token_indices(range(20, 28), P), on_ready=on_ready) == [True] * 8
    assert np.array_equal(view[:, 20:28], expected)
    assert during == [(8, [False] * 4)]  # 8 claims held; nothing evictable
    assert len(released) == 8 and runner.claims == 0  # exactly the read's handles went back
    assert pipeline.stats().pools["kv"]["runner"]["claims_held"] == 0
    assert pipeline.set(intruders, token_indices(range(40, 44), P)) == [True] * 4
    assert pipeline.exists(keys) == 0  # LRU: the oldest went


def test_deleted_keys_are_evicted_before_live_ones(kvcr_pipeline: Any) -> None:
    capacity = 16 * geometry().page_bytes
    for delete in (False, True):
        pipeline = kvcr_pipeline(placement__capacity_bytes=capacity)
        geo = geometry()
        pipeline.register_pool("kv", geo, pool_buffer(geo))
        older, newer, later = fresh_keys(8), fresh_keys(8), fresh_keys(8)
        assert pipeline.set(older, token_indices(range(8), P)) == [True] * 8
        assert pipeline.set(newer, token_indices(range(8, 16), P)) == [True] * 8
        if delete:
            assert pipeline.delete(newer) == 8
            assert pipeline.stats().pools["kv"]["dead_blocks"] == 8
        assert pipeline.set(later, token_indices(range(16, 24), P)) == [True] * 8
        assert pipeline.exists(later) == 8
        if delete:  # the dead blocks made room; every live key stayed
            assert pipeline.exists(older) == 8 and pipeline.exists(newer) == 0
            assert pipeline.stats().pools["kv"]["dead_blocks"] == 0  # KVCR removed them
        else:  # plain LRU: the oldest live keys went
            assert pipeline.exists(older) == 0 and pipeline.exists(newer) == 8
        pipeline.close()


@pytest.mark.parametrize("forget", ["delete", "clear"])
def test_a_key_stored_again_after_it_was_forgotten_restores_its_new_bytes(
    kvcr_pipeline: Any, forget: str
) -> None:
    pipeline = kvcr_pipeline()
    geo, buffer, keys = stored(pipeline, n=4)
    if forget == "delete":
        assert pipeline.delete([*keys, "never-stored"]) == 4
    else:
        pipeline.clear()
    assert pipeline.exists(keys) == 0
    assert pipeline.get(keys, token_indices(range(20, 24), P)) == [False] * 4
    view = pages_of(buffer, geo)
    assert (
        pipeline.set(keys, token_indices(range(10, 14), P)) == [True] * 4
    )  # other bytes, same keys
    expected = view[:, 10:14].copy()
    assert not np.array_equal(expected, view[:, 0:4])
    assert pipeline.get(keys, token_indices(range(20, 24), P)) == [True] * 4
    assert np.array_equal(view[:, 20:24], expected)


def test_g3_files_hold_what_dram_cannot_and_restore_exactly(
    kvcr_pipeline: Any, tmp_path: Path
) -> None:
    """An MLA page-first pool (pages of one 4 KiB element: KVCR's G3 takes single-element
    blocks, on page-aligned memory); DRAM holds 4 pages, two G3 files 8 each."""
    geo = PoolGeometry("kv", "page_first", 4, 1, 128, "float16", 4, 4 * 48, mla=True)
    assert geo.page_bytes == 4096 and geo.fragments_per_page == 1
    folder = tmp_path / "g3"
    folder.mkdir()
    files = [folder / "g3-a", folder / "g3-b"]
    pipeline = kvcr_pipeline(
        placement__capacity_bytes=4 * geo.page_bytes,
        backend__options__g3_paths=[str(f) for f in files],
        backend__options__g3_capacity_bytes_per_file=8 * geo.page_bytes,
        # Pages in G3 are claimed batch by batch (copied into DRAM first): a window that fits.
        batching__read_batch_pages=2,
        batching__window_batches=1,
    )
    buffer = pool_buffer(geo, 5)
    pipeline.register_pool("kv", geo, buffer)
    keys = fresh_keys(12)
    for start in range(0, 12, 2):  # KVCR spills DRAM's oldest to G3 as new pages arrive
        assert (
            pipeline.set(keys[start : start + 2], token_indices(range(start, start + 2), P))
            == [True] * 2
        )
    assert pipeline.exists(keys) == 12
    assert sorted(p.name for p in folder.iterdir()) == ["g3-a.kv", "g3-b.kv"]
    tiers = [tier for _, tier in kvcr_of(pipeline).query(pool_tier(pipeline).keys.block_keys(keys))]
    assert [t.name for t in tiers] == ["G3"] * 8 + ["LOCAL_G2"] * 4
    view = pages_of(buffer, geo)
    expected = view[:, :12].copy()
    view[:, 20:32] = 0
    assert pipeline.get(keys, token_indices(range(20, 32), P)) == [True] * 12
    assert np.array_equal(view[:, 20:32], expected)
    stats = pipeline.stats()
    assert stats.fallbacks == {}  # every batch fitted
    assert stats.pools["kv"]["runner"]["kvcr"]["gauges"]  # KVCR's own state reaches stats()


def test_g3_refuses_pages_of_several_fragments(kvcr_pipeline: Any, tmp_path: Path) -> None:
    from kvcr_policy.errors import PoolError

    pipeline = kvcr_pipeline(
        backend__options__g3_paths=[str(tmp_path / "g3")],
        backend__options__g3_capacity_bytes_per_file="1MiB",
    )
    with pytest.raises(PoolError, match="G3 tier takes single-element blocks only"):
        pipeline.register_pool("kv", geometry(), pool_buffer(geometry()))
