"""The I/O engine on real files: runs cover every position once, pages round-trip through
direct and buffered files in every layout, and a damaged page is never copied into the pool."""

from __future__ import annotations

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
@pytest.mark.parametrize("direct", ["auto", "off"])
def test_pages_round_trip(tmp_path: Path, layout: str, direct: str) -> None:
    rig = Rig(tmp_path, small_geometry(layout), 40, direct=direct)
    try:
        if direct == "off":
            assert not rig.tier.files.direct
        keys = [f"{layout}-{i}" for i in range(30)]
        assert rig.set(keys) == [True] * 30
        assert rig.get(keys[::-1]) == [True] * 30
        for page, key in enumerate(keys[::-1]):
            assert rig.page(page).tobytes() == expected(key, rig.geometry.page_bytes)
    finally:
        rig.close()


def test_a_damaged_page_is_not_copied_and_its_key_misses_after(tmp_path: Path) -> None:
    rig = Rig(tmp_path, small_geometry(), 8)
    try:
        keys = ["a", "b", "c"]
        assert rig.set(keys) == [True] * 3
        slot = int(rig.tier.fmap[rig.tier.store.lookup(["b"])[0]])
        with open(rig.tier.files.directory / "slots", "r+b") as f:
            f.seek(slot * rig.tier.files.stride + 5)
            byte = f.read(1)
            f.seek(slot * rig.tier.files.stride + 5)
            f.write(bytes([byte[0] ^ 0xFF]))
        got = rig.get(keys)
        assert got == [True, False, True]
        assert not rig.page(1).any()  # never copied
        assert rig.tier.contains(["b"]) == 0
        assert rig.tier.stats()["damaged_reads"] == 1
    finally:
        rig.close()
