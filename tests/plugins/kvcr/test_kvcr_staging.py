"""The staging area of the ``kvcr`` backend (``backend.options.staging``), on real KVCR runners.

Staged pages are one KVCR element each: a page stored through the staging area reads back
byte-exact for any layout of many fragments and any page list, through a staging area smaller
than a batch (so a batch moves in parts and reuses slots). The element layout differs from the
unstaged form, so staged blocks are keyed apart: a reader of the other form on the same KVCR
misses them and leaves the pool untouched, which is what switching between the bundled profiles
does (the default ``with_coalescing`` stages under throughput, not under default; explicit
options win). The area is bounded and reported; one smaller than a page is refused with the
option to change. No speed is asserted (``kvcr-policy bench``).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcr_policy.backends.staging import stages_pages
from kvcr_policy.errors import PoolError
from kvcr_policy.geometry import PoolGeometry
from tests.plugins.kvcr.kvcr_helpers import kvcr_of, pool_tier, spy
from tests.strategies import geometries
from tests.support.pools import (
    fresh_keys,
    page_bytes,
    page_slice,
    pool_buffer,
    raw_bytes,
    token_indices,
)

#: Room for a few of the drawn pages (at most 3 KiB each): a batch moves in several parts.
STAGING_BYTES = 8 << 10
STAGED = {
    "backend__options__staging": "always",
    "backend__options__staging_bytes": STAGING_BYTES,
    "batching__read_batch_pages": 4,
}
_names = itertools.count()


def random_pool(geometry: PoolGeometry, seed: int) -> np.ndarray:
    """A pool of the geometry's own dtype holding random bytes."""
    buffer = np.empty(geometry.shape, dtype=geometry.dtype)
    raw = raw_bytes(buffer)
    raw[:] = np.random.default_rng(seed).integers(0, 256, raw.size, dtype=np.uint8)
    return buffer


def test_staged_keys_are_apart_from_plain_ones_in_every_epoch() -> None:
    from kvcr_policy_kvcr.keys import KeySpace

    staged, plain = KeySpace(staged=True), KeySpace()
    for _ in range(2):
        ours, theirs = staged.block_keys(["a", "b"]), plain.block_keys(["a", "b"])
        assert not set(ours) & set(theirs)
        assert all(key.startswith(staged.live_prefix) for key in ours)
        assert not any(key.startswith(staged.live_prefix) for key in theirs)
        staged.forget(["a"])
        staged.clear()
        plain.clear()


@settings(
    suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None, max_examples=12
)
@given(
    geometry=geometries(max_pages=8).filter(lambda g: g.fragments_per_page > 1),
    data=st.data(),
)
def test_staged_pages_are_byte_exact(
    kvcr_pipeline: Any, geometry: PoolGeometry, data: st.DataObject
) -> None:
    """Stored staged, read staged into other pages: every page arrives whole, in parts of a
    batch that reuse the area's slots."""
    pipeline = kvcr_pipeline(**STAGED)
    name = f"kv{next(_names)}"
    geometry = replace(geometry, name=name)
    buffer = random_pool(geometry, seed=geometry.pages)
    pipeline.register_pool(name, geometry, buffer)
    order = data.draw(st.permutations(range(geometry.pages)))
    n = max(1, geometry.pages // 2)
    src, dst = order[:n], (order[n : 2 * n] or order[:n])
    expected = [page_bytes(buffer, geometry, p) for p in src]
    keys = fresh_keys(n)
    assert pipeline.set(keys, token_indices(src, geometry.page_size), name) == [True] * n
    for page in dst:
        buffer[page_slice(geometry, page)] = 0
    assert pipeline.get(keys, token_indices(dst, geometry.page_size), name) == [True] * n
    assert [page_bytes(buffer, geometry, page) for page in dst] == expected
    area = pool_tier(pipeline, name).staging.describe()
    assert area["peak_slots_taken"] <= area["slots"]
    assert area["retired_slots"] == 0


def test_a_page_is_one_element_and_a_batch_moves_in_parts(kvcr_pipeline: Any) -> None:
    geometry = PoolGeometry("kv", "layer_first", 4, 2, 8, "float16", 4, 64)  # 1 KiB pages
    pipeline = kvcr_pipeline(
        backend__options__staging="always",
        backend__options__staging_bytes=4 * geometry.page_bytes,
        batching__read_batch_pages=8,
    )
    buffer = pool_buffer(geometry)
    pipeline.register_pool("kv", geometry, buffer)
    keys = fresh_keys(8)
    with spy(kvcr_of(pipeline)) as calls:
        assert pipeline.set(keys, token_indices(range(8), 4)) == [True] * 8
        assert pipeline.get(keys, token_indices(range(8, 16), 4)) == [True] * 8
    assert calls.sizes["deposit"] == [2, 2, 2, 2]  # parts of half the 4 slots
    assert calls.sizes["deliver"] == [2, 2, 2, 2]
    assert pool_tier(pipeline).layout.labels == ["kv"]  # one unlabelled element per page
    stats = pipeline.stats()
    area = stats.pools["kv"]["staging"]
    assert area["bytes"] == 4 * geometry.page_bytes
    assert area["slots"] == 4
    assert stats.transport["staging"]["pools"]["kv"]["slots"] == 4
    assert stats.transport["staging"]["value"] == "always"


@pytest.mark.parametrize(
    ("writer", "reader"), [("throughput", "default"), ("default", "throughput")]
)
def test_a_tier_written_under_one_profile_misses_under_the_other(
    kvcr_pipeline: Any, writer: str, reader: str
) -> None:
    """Switching between the bundled profiles switches the form of a pool of small
    ``layer_first`` fragments (staged under throughput, not under default): the writer's KVCR,
    asked with the reader's block keys (the reader pool's own key space), misses every page and
    leaves the pool untouched, in both directions."""
    geometry = PoolGeometry("kv", "layer_first", 4, 2, 8, "float16", 4, 64)
    written, read = kvcr_pipeline(profile=writer), kvcr_pipeline(profile=reader)
    buffer = pool_buffer(geometry)
    written.register_pool("kv", geometry, buffer)
    read.register_pool("kv", geometry, pool_buffer(geometry))
    tier, other = pool_tier(written), pool_tier(read)
    assert (tier.staging is None) == (writer == "default") != (other.staging is None)
    keys = fresh_keys(6)
    assert written.set(keys, token_indices(range(6), 4)) == [True] * 6
    raw = raw_bytes(buffer)
    before = raw.copy()
    own, tier.keys = tier.keys, other.keys
    try:
        assert written.exists(keys) == 0
        assert written.get(keys, token_indices(range(10, 16), 4)) == [False] * 6
        assert np.array_equal(raw, before)
    finally:
        tier.keys = own
    assert written.exists(keys) == 6


@pytest.mark.parametrize(
    ("profile", "option", "mode", "staged"),
    [
        ("default", None, "never", False),  # upstream: one element per fragment
        ("throughput", None, "auto", True),  # the profile coalesces: small fragments stage
        ("throughput", "never", "never", False),  # an explicit option wins, both ways
        ("default", "always", "always", True),
        ("default", "auto", "auto", True),
    ],
)
def test_staging_follows_the_coalescing_control_unless_set(
    kvcr_pipeline: Any, profile: str, option: str | None, mode: str, staged: bool
) -> None:
    """``with_coalescing`` (the default) resolves from ``coalescing.strategy``, and the stats
    say how; a page of one fragment never stages, whatever the mode."""
    overrides = {} if option is None else {"backend__options__staging": option}
    pipeline = kvcr_pipeline(profile=profile, **overrides)
    many = PoolGeometry("kv", "layer_first", 4, 2, 8, "float16", 4, 64)
    one = PoolGeometry("one", "page_first", 4, 1, 8, "float16", 4, 64, mla=True)
    for geometry in (many, one):
        pipeline.register_pool(geometry.name, geometry, pool_buffer(geometry))
    stats = pipeline.stats()
    assert (stats.pools["kv"]["staging"] is not None) == staged
    assert stats.pools["one"]["staging"] is None
    report = stats.transport["staging"]
    assert report["value"] == mode
    assert sorted(report["pools"]) == (["kv"] if staged else [])
    if option is None:
        strategy = "none" if profile == "default" else "contiguous"
        expected = f"(from default): with_coalescing -> {mode} (coalescing.strategy = '{strategy}'"
        assert expected in report["source"]
    else:
        assert report["source"] == "backend.options.staging (from override)"


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=50)
@given(
    staging=st.sampled_from(["with_coalescing", "never", "auto", "always"]),
    coalescing=st.just("none") | st.text(min_size=1),  # any other strategy coalesces
    geometry=geometries(max_pages=4),
)
def test_the_resolved_mode_is_the_option_or_follows_coalescing(
    staging: str, coalescing: str, geometry: PoolGeometry
) -> None:
    from kvcr_policy_kvcr.options import KvcrOptions, resolved_staging

    options = KvcrOptions(staging=staging)  # type: ignore[arg-type]
    mode = resolved_staging(options, coalescing)
    if staging != "with_coalescing":
        assert mode == staging
    else:
        assert mode == ("never" if coalescing == "none" else "auto")
    if geometry.fragments_per_page == 1 or mode == "never":
        assert not stages_pages(mode, geometry, int(options.staging_below_bytes))


def test_a_staging_area_smaller_than_a_page_is_refused(kvcr_pipeline: Any) -> None:
    geometry = PoolGeometry("kv", "layer_first", 4, 2, 8, "float16", 4, 64)
    pipeline = kvcr_pipeline(
        backend__options__staging="always", backend__options__staging_bytes=100
    )
    expected = r"staging_bytes \(100 bytes\) holds no page of it \(1024 bytes\)"
    with pytest.raises(PoolError, match=expected):
        pipeline.register_pool("kv", geometry, pool_buffer(geometry))


def test_staged_pages_of_many_fragments_can_spill_to_g3(kvcr_pipeline: Any, tmp_path: Path) -> None:
    """A staged page is one element, so KVCR's G3 tier takes ``layer_first`` pages too (DRAM
    holds 4 pages of 4 KiB, two G3 files 8 each)."""
    geometry = PoolGeometry("kv", "layer_first", 4, 2, 32, "float16", 4, 4 * 48)
    assert geometry.page_bytes == 4096 and geometry.fragments_per_page == 8
    folder = tmp_path / "g3"
    folder.mkdir()
    pipeline = kvcr_pipeline(
        placement__capacity_bytes=4 * geometry.page_bytes,
        backend__options__g3_paths=[str(folder / "g3-a"), str(folder / "g3-b")],
        backend__options__g3_capacity_bytes_per_file=8 * geometry.page_bytes,
        backend__options__staging="always",
        batching__read_batch_pages=2,
        batching__window_batches=1,
    )
    buffer = pool_buffer(geometry, 5)
    pipeline.register_pool("kv", geometry, buffer)
    keys = fresh_keys(12)
    for start in range(0, 12, 2):  # KVCR spills DRAM's oldest to G3 as new pages arrive
        pages = token_indices(range(start, start + 2), 4)
        assert pipeline.set(keys[start : start + 2], pages) == [True] * 2
    tiers = [t for _, t in kvcr_of(pipeline).query(pool_tier(pipeline).keys.block_keys(keys))]
    assert [t.name for t in tiers] == ["G3"] * 8 + ["LOCAL_G2"] * 4
    expected = [page_bytes(buffer, geometry, p) for p in range(12)]
    assert pipeline.get(keys, token_indices(range(20, 32), 4)) == [True] * 12
    assert [page_bytes(buffer, geometry, p) for p in range(20, 32)] == expected


def test_an_area_of_tiny_pages_has_at_most_max_slots(kvcr_pipeline: Any) -> None:
    from kvcr_policy_kvcr.staging import MAX_SLOTS

    geometry = PoolGeometry("kv", "page_first", 1, 1, 8, "uint8", 1, 64)  # pages of 16 bytes
    assert geometry.fragments_per_page == 2
    pipeline = kvcr_pipeline(backend__options__staging="always")  # 64 MiB: 4 Mi pages
    buffer = random_pool(geometry, 1)
    pipeline.register_pool("kv", geometry, buffer)
    area = pipeline.stats().pools["kv"]["staging"]
    assert area["slots"] == MAX_SLOTS
    assert area["bytes"] == MAX_SLOTS * geometry.page_bytes
    keys = fresh_keys(8)
    assert pipeline.set(keys, token_indices(range(8), 1)) == [True] * 8
    expected = [page_bytes(buffer, geometry, p) for p in range(8)]
    assert pipeline.get(keys, token_indices(range(8, 16), 1)) == [True] * 8
    assert [page_bytes(buffer, geometry, p) for p in range(8, 16)] == expected
