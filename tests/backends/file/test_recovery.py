"""Reopening a tier: what was stored comes back, in its write order; every damaged entry is
a miss (dropped on open, or on its first read), never wrong bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcr_policy.backends.file.records import RECORD_BYTES
from tests.backends.file.tiers import Rig, expected, small_geometry


def _reopen(rig: Rig, root: Path, slots: int, **tier: object) -> Rig:
    rig.close()
    return Rig(root, rig.geometry, slots, **tier)


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x5A]))


def test_what_was_stored_comes_back(tmp_path: Path) -> None:
    rig = Rig(tmp_path, small_geometry(), 16)
    keys = [f"k{i}" for i in range(10)]
    assert rig.set(keys) == [True] * 10
    assert rig.tier.drop(["k3"]) == 1  # deleted keys stay deleted
    rig = _reopen(rig, tmp_path, 16)
    try:
        assert rig.tier.recovered["pages"] == 9
        kept = [k for k in keys if k != "k3"]
        assert rig.tier.contains(kept) == 9 and rig.tier.contains(["k3"]) == 0
        assert rig.get(kept) == [True] * 9
        for page, key in enumerate(kept):
            assert rig.page(page).tobytes() == expected(key, rig.geometry.page_bytes)
    finally:
        rig.close()


@pytest.mark.parametrize("check", ["records", "pages"])
def test_damaged_entries_are_misses(tmp_path: Path, check: str) -> None:
    rig = Rig(tmp_path, small_geometry(), 16)
    keys = [f"k{i}" for i in range(6)]
    assert rig.set(keys) == [True] * 6
    where = {k: int(rig.tier.fmap[rig.tier.store.lookup([k])[0]]) for k in keys}
    stride = rig.tier.files.stride
    directory = rig.tier.files.directory
    rig.close()
    _flip(directory / "index", where["k1"] * RECORD_BYTES + 65)  # a torn record (its key)
    _flip(directory / "slots", where["k4"] * stride + 100)  # a torn page
    rig = Rig(tmp_path, small_geometry(), 16, check=check)
    try:
        assert rig.tier.contains(["k1"]) == 0
        assert rig.tier.recovered["dropped"].get("crc") == 1
        if check == "pages":
            assert rig.tier.recovered["dropped"].get("page_crc") == 1
            assert rig.tier.contains(["k4"]) == 0
        else:
            assert rig.get(["k4"]) == [False]  # caught on its first read, then gone
            assert rig.tier.contains(["k4"]) == 0
        good = ["k0", "k2", "k3", "k5"]
        assert rig.get(good) == [True] * 4
        for page, key in enumerate(good):
            assert rig.page(page).tobytes() == expected(key, rig.geometry.page_bytes)
    finally:
        rig.close()


def test_a_smaller_tier_keeps_what_fits_and_a_rewritten_key_its_newest_page(tmp_path: Path) -> None:
    rig = Rig(tmp_path, small_geometry(), 8)
    assert rig.set([f"k{i}" for i in range(8)]) == [True] * 8
    assert rig.tier.drop(["k0"]) == 1
    assert rig.set(["k8"]) == [True]  # reuses k0's slot: its record was a tombstone
    rig = _reopen(rig, tmp_path, 4)
    try:
        kept = [k for k in (f"k{i}" for i in range(9)) if rig.tier.contains([k])]
        assert len(kept) <= 4 and rig.tier.recovered["dropped"].get("past_end", 0) >= 4
        assert rig.get(kept) == [True] * len(kept)
        for page, key in enumerate(kept):
            assert rig.page(page).tobytes() == expected(key, rig.geometry.page_bytes)
    finally:
        rig.close()
