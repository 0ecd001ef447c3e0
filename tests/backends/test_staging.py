"""Tests for kvcr_policy.backends.staging: pages end to end, the slots of an area (taken all at
once, waited for only while none is held, retired), and pages gathered and scattered through it
byte for byte."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.backends.staging import (
    PagePlanes,
    StagingArea,
    fragment_planes,
    packed,
    stages_pages,
)
from kvcr_policy.errors import PoolError, TransportError
from kvcr_policy.geometry import PoolGeometry, fragment_offsets
from tests.strategies import geometries, page_lists
from tests.support.waiting import wait_until


@given(st.lists(st.integers(0, 1 << 20), max_size=64))
def test_packed_lays_pieces_end_to_end(lengths: list[int]) -> None:
    offsets = packed(np.array(lengths, dtype=np.int64))
    ends = np.cumsum(lengths)
    assert offsets.tolist() == [0, *ends[:-1].tolist()][: len(lengths)]


@given(geometries(max_pages=6), st.data())
def test_fragment_planes_are_the_fragments_at_their_offsets(
    g: PoolGeometry, data: st.DataObject
) -> None:
    raw = np.random.default_rng(0).integers(0, 256, g.nbytes, dtype=np.uint8)
    planes = fragment_planes(g, raw.ctypes.data, raw.nbytes, "kv")
    pages = data.draw(page_lists(g.pages))
    offsets = fragment_offsets(g, pages)
    for column, page in enumerate(pages):
        for fragment in range(g.fragments_per_page):
            start = int(offsets[fragment, column])
            expected = raw[start : start + g.fragment_bytes]
            assert np.array_equal(planes[fragment, page], expected)
    planes[:, pages] = 7  # writes land in the buffer itself (no copy)
    assert all((raw[o : o + g.fragment_bytes] == 7).all() for o in offsets.ravel().tolist())
    with pytest.raises(PoolError, match=r"pool 'kv': its fragments reach byte .* past its"):
        fragment_planes(g, raw.ctypes.data, raw.nbytes - 1, "kv")


@given(geometries(), st.integers(1, 1 << 12))
def test_staging_is_chosen_by_the_option_and_the_page(g: PoolGeometry, below: int) -> None:
    many = g.fragments_per_page > 1
    assert not stages_pages("never", g, below)
    assert stages_pages("always", g, below) == many
    assert stages_pages("auto", g, below) == (many and g.fragment_bytes < below)


@given(geometries(max_pages=8), st.data())
def test_pages_gathered_and_scattered_back_are_the_same_bytes(
    g: PoolGeometry, data: st.DataObject
) -> None:
    """Gather is each page's fragments in plane order, end to end; scatter writes exactly the
    pages it is given (where they arrived), and nothing else of the pool."""
    pool = np.random.default_rng(1).integers(0, 256, g.nbytes, dtype=np.uint8)
    before = pool.copy()
    pages = data.draw(page_lists(g.pages))
    slot_pages = data.draw(st.integers(1, max(1, len(pages))))
    slots = max(1, -(-len(pages) // slot_pages))
    area = StagingArea("pool 'kv'", g.page_bytes, slots, slot_pages)
    planes = PagePlanes(g, pool.ctypes.data, pool.nbytes, "kv")
    rows = list(range(len(pages)))
    planes.gather(area, rows, pages)
    offsets = fragment_offsets(g, pages)
    for row, page in enumerate(pages):
        expected = np.concatenate(
            [before[o : o + g.fragment_bytes] for o in offsets[:, row].tolist()]
        )
        assert np.array_equal(area.rows[row], expected), (row, page)
    arrived = data.draw(st.lists(st.booleans(), min_size=len(pages), max_size=len(pages)))
    area.rows[: len(pages)] ^= 0xFF  # what a tier would deliver: other bytes
    planes.scatter(area, rows, pages, arrived)
    written = {page for page, ok in zip(pages, arrived, strict=True) if ok}
    for page in range(g.pages):
        [column] = fragment_offsets(g, [page]).T
        got = np.concatenate([pool[o : o + g.fragment_bytes] for o in column.tolist()])
        old = np.concatenate([before[o : o + g.fragment_bytes] for o in column.tolist()])
        assert np.array_equal(got, old ^ 0xFF if page in written else old), page


def test_an_area_addresses_its_slots_rows_and_bytes() -> None:
    area = StagingArea("pool 'kv'", 16, slots=3, slot_pages=2)
    assert area.nbytes == 3 * 2 * 16 and not area.buffer.any()  # zero-filled, touched
    assert area.slot_rows(1).tolist() == [2, 3] and area.slot_rows(2, 1).tolist() == [4]
    assert area.slot_bytes(1).ctypes.data == area.address + 32 and area.slot_bytes(1).size == 32
    assert area.row_addresses([0, 5]) == [area.address, area.address + 80]
    assert area.describe() == {"bytes": 96, "slots": 3, "slot_pages": 2,
                               "peak_slots_taken": 0, "retired_slots": 0}  # fmt: skip
    with pytest.raises(ValueError, match="at least one slot"):
        StagingArea("pool 'kv'", 16, slots=0)


def test_slots_are_taken_all_at_once_and_a_holder_never_waits() -> None:
    area = StagingArea("pool 'kv'", 8, slots=3)
    first = area.take(2, wait=True)
    assert first is not None and len(first) == 2
    # A caller that holds slots is told at once (it must finish one of its own first).
    assert area.take(2, wait=False) is None
    waited: list[list[int] | None] = []
    taker = threading.Thread(target=lambda: waited.append(area.take(2, wait=True)))
    taker.start()
    wait_until(lambda: taker.is_alive(), "the second call waiting for two free slots", 10)
    assert waited == []  # one slot is free, two are asked: it waits for both
    area.give(first)
    taker.join(10)
    assert waited and waited[0] is not None and len(waited[0]) == 2
    assert area.describe()["peak_slots_taken"] == 2


def test_a_retired_slot_is_never_handed_out_again() -> None:
    area = StagingArea("pool 'kv'", 8, slots=2)
    taken = area.take(2, wait=True)
    assert taken is not None
    area.give(taken[:1], retire=True)
    area.give(taken[1:])
    assert area.usable() == 1 and area.describe()["retired_slots"] == 1
    assert area.take(1, wait=True) == taken[1:]
    with pytest.raises(TransportError, match=r"2 slots asked, 1 usable \(1 retired"):
        area.take(2, wait=True)
