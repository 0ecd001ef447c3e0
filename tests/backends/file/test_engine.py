"""The I/O engine on real files: runs cover every position once, pages round-trip through
direct and buffered files in every layout, and a damaged page is never copied into the pool."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.backends.file.engine import plan_runs
from tests.backends.file.tiers import Rig, expected, small_geometry


@given(st.lists(st.integers(0, 200), unique=True, max_size=80), st.integers(1, 9))
def test_runs_cover_every_position_once_in_consecutive_slots(slots: list[int], per: int) -> None:
    fslots = np.array(slots, dtype=np.int64)
    runs = plan_runs(fslots, per)
    joined = np.concatenate(runs) if runs else np.array([], dtype=np.int64)
    assert sorted(joined.tolist()) == list(range(len(slots)))
    for run in runs:
        assert 1 <= len(run) <= per
        assert np.array_equal(np.diff(fslots[run]), np.ones(len(run) - 1))


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_head"])
@pytest.mark.parametrize("direct", ["auto", "on", "off"])
@pytest.mark.parametrize("in_place", [False, True])
def test_pages_round_trip(tmp_path: Path, layout: str, direct: str, in_place: bool) -> None:
    rig = Rig(tmp_path, small_geometry(layout), 40, in_place, direct=direct)
    try:
        if direct == "off":
            assert not rig.tier.files.direct
        if direct == "on":
            assert rig.tier.files.cache == -1  # the page cache never holds the tier's pages
        keys = [f"{layout}-{i}" for i in range(30)]
        assert rig.set(keys) == [True] * 30
        assert rig.get(keys[::-1]) == [True] * 30
        for page, key in enumerate(keys[::-1]):
            assert rig.page(page).tobytes() == expected(key, rig.geometry.page_bytes)
    finally:
        rig.close()


def _store_and_damage(rig: Rig, keys: list[str], damaged: str) -> None:
    """Store ``keys``, then flip a byte of ``damaged``'s page in the slot file."""
    assert rig.set(keys) == [True] * len(keys)
    slot = int(rig.tier.fmap[rig.tier.store.lookup([damaged])[0]])
    with open(rig.tier.files.directory / "slots", "r+b") as f:
        f.seek(slot * rig.tier.files.stride + 5)
        byte = f.read(1)
        f.seek(slot * rig.tier.files.stride + 5)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_damaged_page_is_not_copied_and_its_key_misses_after(tmp_path: Path) -> None:
    rig = Rig(tmp_path, small_geometry(), 8)
    try:
        keys = ["a", "b", "c"]
        _store_and_damage(rig, keys, "b")
        got = rig.get(keys)
        assert got == [True, False, True]
        assert not rig.page(1).any()  # never copied
        assert rig.tier.contains(["b"]) == 0
        assert rig.tier.stats()["damaged_reads"] == 1
    finally:
        rig.close()


def _keep_only(rig: Rig, slots: list[int]) -> bool:
    """Drop the slot file from the page cache (clean after the sets' fdatasync), then read
    ``slots`` back into it (no readahead); whether the slot after the last is out of it now
    (a file system may keep every page: tmpfs does)."""
    stride = rig.tier.files.stride
    fd = os.open(rig.tier.files.directory / "slots", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        for slot in slots:
            os.pread(fd, stride, slot * stride)
        try:
            os.preadv(fd, [bytearray(1)], (slots[-1] + 1) * stride, os.RWF_NOWAIT)
        except BlockingIOError:
            return True
        return False
    finally:
        os.close(fd)


@pytest.mark.parametrize("in_place", [False, True])
def test_hybrid_reads_take_cached_pages_from_the_page_cache_and_the_others_direct(
    tmp_path: Path, in_place: bool
) -> None:
    rig = Rig(tmp_path, small_geometry(), 16, in_place, direct="auto")
    try:
        if not rig.tier.files.hybrid:
            pytest.skip("this file system does no direct I/O: no hybrid reads")
        keys = [f"k{i}" for i in range(10)]
        assert rig.set(keys) == [True] * 10
        assert rig.get(keys) == [True] * 10  # just written: all in the page cache
        assert rig.tier.stats()["read_pages"] == {"page_cache": 10, "direct": 0, "buffered": 0}
        # Only pages 0..2 stay in the page cache: the run reads them from it, then 3..9 direct.
        slots = [int(rig.tier.fmap[s]) for s in rig.tier.store.lookup(keys)]
        assert slots == sorted(slots) and slots[-1] - slots[0] == 9  # one run
        evicted = _keep_only(rig, slots[:3])
        assert rig.get(keys) == [True] * 10
        for page, key in enumerate(keys):
            assert rig.page(page).tobytes() == expected(key, rig.geometry.page_bytes)
        paths = rig.tier.stats()["read_pages"]
        assert paths["page_cache"] + paths["direct"] == 20
        assert paths["buffered"] == 0
        if evicted:  # (the kernel may have cached a little more than pages 0..2)
            assert paths["page_cache"] >= 13 and paths["direct"] >= 1
    finally:
        rig.close()


def test_a_damaged_page_read_in_place_is_zeroed_and_its_key_misses_after(tmp_path: Path) -> None:
    rig = Rig(tmp_path, small_geometry(), 8, True, direct="off")
    try:
        keys = ["a", "b", "c"]
        _store_and_damage(rig, keys, "b")
        assert rig.get(keys) == [True, False, True]
        assert not rig.page(1).any()
        assert rig.tier.contains(["b"]) == 0
    finally:
        rig.close()
