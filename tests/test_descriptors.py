"""Tests for kvcr_policy.descriptors: building, coalescing and splitting copy plans."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.descriptors import (
    Descriptors,
    build_descriptors,
    coalesce,
    slot_descriptors,
    split,
)
from kvcr_policy.errors import IndicesError, PoolError
from kvcr_policy.geometry import LAYOUTS, MLA_LAYOUTS, Layout, PoolGeometry
from tests.strategies import PageTransfer, descriptors, page_transfers

ALL_KINDS = [(layout, False) for layout in LAYOUTS] + [(layout, True) for layout in MLA_LAYOUTS]


def make(layout: Layout, *, mla: bool = False, tokens: int = 16, name: str = "kv") -> PoolGeometry:
    return PoolGeometry(
        name=name,
        layout=layout,
        layers=3,
        heads=1 if mla else 2,
        head_dim=4,
        dtype="float32",
        page_size=2,
        tokens=tokens,
        mla=mla,
    )


def byte_map(d: Descriptors) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every byte the plan copies, in order: (source byte, destination byte, descriptor)."""
    owner = np.repeat(np.arange(len(d)), d.length)
    within = np.arange(owner.size) - np.repeat(np.cumsum(d.length) - d.length, d.length)
    return d.src[owner] + within, d.dst[owner] + within, owner


def execute(d: Descriptors, src: np.ndarray, dst: np.ndarray) -> None:
    """A reference executor: copy the plan's bytes between two C-contiguous numpy buffers."""
    src_bytes, dst_bytes, _ = byte_map(d)
    dst.reshape(-1).view(np.uint8)[dst_bytes] = src.reshape(-1).view(np.uint8)[src_bytes]


def page_view(buffer: np.ndarray, g: PoolGeometry, page: int) -> np.ndarray:
    """One page as a (kv, layer, token, head, dim) array, by numpy indexing of the layout."""
    tokens = slice(page * g.page_size, (page + 1) * g.page_size)
    if g.mla:
        buffer = buffer[None]
    if g.layout == "layer_first":  # (kv, L, T, H, D)
        return buffer[:, :, tokens]
    if g.layout == "page_first":  # (kv, T, L, H, D)
        return buffer[:, tokens].transpose(0, 2, 1, 3, 4)
    if g.layout == "page_first_direct":  # (kv, T/P, L, P, H, D)
        return buffer[:, page]
    return buffer[:, page].transpose(0, 3, 2, 1, 4)  # page_head: (kv, T/P, H, P, L, D)


# --- the value type ----------------------------------------------------------------------


def test_field_order_is_pinned() -> None:
    assert list(Descriptors.__dataclass_fields__) == [
        "src",
        "dst",
        "length",
        "bound",
        "page",
        "page_end",
    ]


def test_from_arrays_defaults_and_basics() -> None:
    d = Descriptors.from_arrays([0, 10], [5, 50], [3, 4])
    assert len(d) == 2
    assert d.nbytes == 7
    assert d.bound.tolist() == [0, 0]
    assert (d.page.tolist(), d.page_end.tolist()) == ([0, 1], [1, 2])
    assert len(Descriptors.empty()) == 0
    assert Descriptors.empty().nbytes == 0


def test_rejects_bad_arrays() -> None:
    ints = np.zeros(2, dtype=np.int64)
    with pytest.raises(TypeError, match=r"Descriptors.dst: expected a 1-D int64 array"):
        Descriptors(ints, ints.astype(np.int32), ints, ints, ints, ints)
    with pytest.raises(ValueError, match=r"Descriptors.length: expected length 2.*got 3"):
        Descriptors(ints, ints, np.zeros(3, dtype=np.int64), ints, ints, ints)


def test_concat_and_take() -> None:
    a = Descriptors.from_arrays([0], [0], [4], bound=[1])
    b = Descriptors.from_arrays([8, 16], [8, 16], [2, 3], bound=[2, 3])
    both = Descriptors.concat(a, b)
    assert both.src.tolist() == [0, 8, 16]
    assert both.bound.tolist() == [1, 2, 3]
    assert len(Descriptors.concat()) == 0
    assert both.take(np.array([True, False, True])).src.tolist() == [0, 16]
    assert both.take([2, 0]).length.tolist() == [3, 4]


# --- build --------------------------------------------------------------------------------


@pytest.mark.parametrize(("layout", "mla"), ALL_KINDS)
def test_build_is_fragment_major(layout: Layout, mla: bool) -> None:
    pool = make(layout, mla=mla)
    tier = make(layout, mla=mla, tokens=40, name="tier")
    d = build_descriptors(pool, [5, 2, 7], tier, [0, 19, 3], bound_base=10)
    planes = pool.fragments_per_page
    assert len(d) == 3 * planes
    assert d.bound.tolist() == [10 + f for f in range(planes) for _ in range(3)]
    assert d.page.tolist() == [0, 1, 2] * planes
    assert (d.page_end - d.page).tolist() == [1] * len(d)
    assert set(d.length.tolist()) == {pool.fragment_bytes}
    assert d.nbytes == 3 * pool.page_bytes


@pytest.mark.parametrize(("layout", "mla"), ALL_KINDS)
def test_contiguous_run_coalesces_to_one_descriptor_per_plane(layout: Layout, mla: bool) -> None:
    pool = make(layout, mla=mla)
    tier = make(layout, mla=mla, tokens=40, name="tier")
    d = coalesce(build_descriptors(pool, range(2, 7), tier, range(11, 16)))
    assert len(d) == pool.fragments_per_page
    assert d.length.tolist() == [5 * pool.fragment_bytes] * pool.fragments_per_page
    assert d.bound.tolist() == list(range(pool.fragments_per_page))
    assert (d.page.tolist(), d.page_end.tolist()) == ([0] * len(d), [5] * len(d))


def test_planes_never_merge_even_when_bytes_touch() -> None:
    # The last page of plane f ends where page 0 of plane f+1 begins, on both sides.
    pool = make("page_first")
    d = build_descriptors(pool, [0, 7], pool, [0, 7])
    assert d.src[1] + d.length[1] == d.src[2]
    assert d.dst[1] + d.length[1] == d.dst[2]
    assert len(coalesce(d)) == 4


def test_build_refuses_different_layouts() -> None:
    with pytest.raises(PoolError, match=r"'kv' and 'tier'.*layout 'page_first' vs 'page_head'"):
        build_descriptors(make("page_first"), [0], make("page_head", name="tier"), [0])


def test_build_refuses_unequal_page_counts() -> None:
    with pytest.raises(PoolError, match=r"expected as many destination pages.*\(2\), got 1"):
        build_descriptors(make("page_first"), [0, 1], make("page_first"), [0])


def test_build_refuses_out_of_range_pages() -> None:
    with pytest.raises(IndicesError, match=r"pool 'tier'.*position 1.*page < 4, got 4"):
        build_descriptors(
            make("page_first"), [0, 1], make("page_first", tokens=8, name="tier"), [0, 4]
        )


def test_build_empty() -> None:
    pool = make("layer_first")
    d = build_descriptors(pool, [], pool, [])
    assert len(d) == 0
    assert len(coalesce(d)) == 0
    assert len(split(d, 4)) == 0


@given(page_transfers(), st.integers(1, 64), st.booleans())
def test_plan_reproduces_pages(t: PageTransfer, limit: int, shape_plan: bool) -> None:
    src = np.arange(math.prod(t.src.shape), dtype=t.src.dtype).reshape(t.src.shape) + 1
    dst = np.zeros(t.dst.shape, dtype=t.dst.dtype)
    plan = build_descriptors(t.src, t.src_pages, t.dst, t.dst_pages)
    if shape_plan:
        plan = split(coalesce(plan), limit)
    execute(plan, src, dst)
    for s, d in zip(t.src_pages, t.dst_pages, strict=True):
        assert np.array_equal(page_view(dst, t.dst, d), page_view(src, t.src, s))
    untouched = sorted(set(range(t.dst.pages)) - set(t.dst_pages))
    for d in untouched:
        assert not page_view(dst, t.dst, d).any()


# --- coalesce and split -------------------------------------------------------------------


@given(descriptors(), st.integers(1, 12))
def test_coalesce_then_split_moves_the_same_bytes_in_order(d: Descriptors, limit: int) -> None:
    shaped = split(coalesce(d), limit)
    src_before, dst_before, owner_before = byte_map(d)
    src_after, dst_after, owner_after = byte_map(shaped)
    assert np.array_equal(src_after, src_before)
    assert np.array_equal(dst_after, dst_before)
    # Each source and destination byte exactly once (the generated ranges are disjoint).
    assert len(np.unique(src_after)) == len(src_after) == d.nbytes
    assert len(np.unique(dst_after)) == len(dst_after)
    # No byte changed bound, and each byte's page lies in its descriptor's page range.
    assert np.array_equal(shaped.bound[owner_after], d.bound[owner_before])
    assert np.all(shaped.page[owner_after] <= d.page[owner_before])
    assert np.all(d.page_end[owner_before] <= shaped.page_end[owner_after])


@given(descriptors())
def test_coalesce_never_merges_across_bounds(d: Descriptors) -> None:
    merged = coalesce(d)
    runs_of_bounds = 1 + int(np.count_nonzero(np.diff(d.bound))) if len(d) else 0
    assert len(merged) >= runs_of_bounds
    assert np.all(np.diff(merged.bound) >= 0)  # the strategy's bounds only increase


@given(descriptors())
def test_coalesce_is_maximal_and_idempotent(d: Descriptors) -> None:
    merged = coalesce(d)
    joinable = (
        (merged.src[1:] == merged.src[:-1] + merged.length[:-1])
        & (merged.dst[1:] == merged.dst[:-1] + merged.length[:-1])
        & (merged.bound[1:] == merged.bound[:-1])
    )
    assert not joinable.any()
    again = coalesce(merged)
    for name in Descriptors.__dataclass_fields__:
        assert np.array_equal(getattr(again, name), getattr(merged, name))


@given(descriptors(max_length=40), st.integers(1, 16))
def test_split_respects_limit(d: Descriptors, limit: int) -> None:
    pieces = split(d, limit)
    assert np.all(pieces.length <= limit)
    assert pieces.nbytes == d.nbytes
    # All but the last piece of each descriptor are exactly `limit`.
    expected = np.maximum(1, -(-d.length // limit))
    assert len(pieces) == int(expected.sum())
    last = np.cumsum(expected) - 1
    not_last = np.ones(len(pieces), dtype=bool)
    not_last[last] = False
    assert np.all(pieces.length[not_last] == limit)


def test_split_examples() -> None:
    d = Descriptors.from_arrays([0, 100], [1000, 2000], [10, 3], bound=[4, 5])
    s = split(d, 4)
    assert s.src.tolist() == [0, 4, 8, 100]
    assert s.dst.tolist() == [1000, 1004, 1008, 2000]
    assert s.length.tolist() == [4, 4, 2, 3]
    assert s.bound.tolist() == [4, 4, 4, 5]
    assert s.page.tolist() == [0, 0, 0, 1]
    assert split(d, 10) is d
    with pytest.raises(ValueError, match="split limit: expected a positive byte count, got 0"):
        split(d, 0)


def test_coalesce_example() -> None:
    d = Descriptors.from_arrays(
        [0, 4, 8, 12, 20], [0, 4, 9, 13, 17], [4, 4, 4, 4, 4], bound=[0, 0, 0, 1, 1]
    )
    c = coalesce(d)
    assert c.src.tolist() == [0, 8, 12, 20]
    assert c.length.tolist() == [8, 4, 4, 4]
    assert c.bound.tolist() == [0, 0, 1, 1]
    assert (c.page.tolist(), c.page_end.tolist()) == ([0, 2, 3, 4], [2, 3, 4, 5])


@given(page_transfers(), st.booleans())
def test_slot_descriptors_move_the_same_pool_bytes_into_each_slot_whole(
    t: PageTransfer, read: bool
) -> None:
    """Pool -> tier (or tier -> pool when ``read``): the pool side is the one
    :func:`build_descriptors` plans, and the tier side covers exactly slot ``s``'s
    ``page_bytes`` for every page, fragment by fragment in fragment order, so each slot is one
    contiguous page of the tier."""
    pool, slots = (t.src, np.asarray(t.dst_pages, dtype=np.int64))
    pages = np.asarray(t.src_pages, dtype=np.int64)
    d = slot_descriptors(pool, pages, t.dst, slots, read=read)
    if read:
        plain = build_descriptors(t.dst, slots, pool, pages)
        pool_side, tier_side, kept = d.dst, d.src, plain.dst
    else:
        plain = build_descriptors(pool, pages, t.dst, slots)
        pool_side, tier_side, kept = d.src, d.dst, plain.src

    # The same fragments (page, fragment, pool offset, length), now page-major: each slot's
    # descriptors adjacent, fragment by fragment.
    def fragments(x: Descriptors, pool_offsets: np.ndarray) -> list[tuple[int, ...]]:
        columns = (x.page, x.bound, pool_offsets, x.length)
        return sorted(zip(*(c.tolist() for c in columns), strict=True))

    assert fragments(d, pool_side) == fragments(plain, kept)
    assert np.all(np.diff(d.page) >= 0)
    planes = pool.fragments_per_page
    assert d.bound.tolist() == list(range(planes)) * len(pages)  # in fragment order
    assert np.array_equal(d.page_end, d.page + 1)
    page_bytes = t.dst.page_bytes
    assert np.all(tier_side + d.length <= t.dst.nbytes)
    for i, slot in enumerate(slots):
        mine = np.sort(tier_side[d.page == i])
        starts = slot * page_bytes + np.arange(len(mine)) * t.dst.fragment_bytes
        assert np.array_equal(mine, starts)  # the slot tiled whole, in order
    # Fragment f of each page keeps its place in the page: f * fragment_bytes into the slot.
    assert np.array_equal(tier_side - slots[d.page] * page_bytes, d.bound * t.dst.fragment_bytes)


def test_slot_descriptors_refuse_as_build_descriptors_does() -> None:
    g = PoolGeometry("kv", "layer_first", 2, 1, 4, "float32", 2, 8)
    with pytest.raises(PoolError, match="expected as many destination pages as source pages"):
        slot_descriptors(g, [0, 1], g, [0], read=True)
    with pytest.raises(IndicesError):
        slot_descriptors(g, [0, 9], g, [0, 1], read=False)
