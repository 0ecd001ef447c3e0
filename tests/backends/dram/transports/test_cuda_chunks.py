"""Tests for the staging ring's whole-batch checks and chunking (numpy only, no GPU needed).

A chunked restore is replayed on host memory as the GPU runs it: each chunk planned on its own
(the batch cleared by :func:`overlapping` first, so without the per-plan check), its fills
copied and scattered in order; the pool must end as one copy per descriptor leaves it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.backends.dram.transports.cuda_chunks import (
    any_remainder,
    chunk_bounds,
    host_runs,
    overlapping,
    repeats,
)
from kvcr_policy.backends.dram.transports.cuda_plan import host_spans, plan_staging
from tests.backends.dram.transports.test_cuda_plan import naive, replay_restore, replay_store
from tests.strategies import scattered_slots

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]


def naive_overlap(offsets: np.ndarray, length: np.ndarray) -> bool:
    seen: set[int] = set()
    for o, n in zip(offsets.tolist(), length.tolist(), strict=True):
        block = set(range(o, o + n))
        if seen & block:
            return True
        seen |= block
    return False


@given(
    st.lists(st.tuples(st.integers(0, 64), st.integers(0, 9)), max_size=24),
    st.sampled_from((1, 4, 8)),
)
def test_overlapping_agrees_with_a_byte_by_byte_check(
    ranges: list[tuple[int, int]], scale: int
) -> None:
    offsets = np.asarray([o * scale for o, _ in ranges], dtype=np.int64)
    length = np.asarray([n * scale for _, n in ranges], dtype=np.int64)
    assert overlapping(offsets, length) == naive_overlap(offsets, length)
    equal = np.full(len(offsets), 4 * scale, dtype=np.int64)  # the bitmap's shape
    aligned = offsets - offsets % (4 * scale)
    assert overlapping(aligned, equal) == naive_overlap(aligned, equal)


@given(st.lists(st.integers(-(1 << 40), 1 << 40), max_size=30), st.integers(1, 1 << 12))
def test_repeats_and_remainders_agree_with_plain_python(values: list[int], scale: int) -> None:
    """Values near each other take the bitmap, values far apart the sort."""
    for spread in (values, [v % (4 * scale) for v in values]):
        array = np.asarray(spread, dtype=np.int64)
        assert repeats(array) == (len(set(spread)) != len(spread))
    array = np.asarray(values, dtype=np.int64)
    for divisor in (scale, 1 << (scale % 20)):  # any, then a power of two (a mask)
        assert any_remainder(array, divisor) == any(v % divisor for v in values)


@given(
    st.one_of(
        st.lists(st.integers(0, 1 << 20), max_size=40),
        # A pool's fragments: one length (chunked without prefix sums).
        st.builds(lambda n, size: [size] * n, st.integers(0, 40), st.integers(0, 1 << 20)),
    ),
    st.integers(1, 1 << 21),
    st.one_of(st.none(), st.integers(1, 1 << 21)),
)
def test_chunks_cover_every_descriptor_once_in_order_and_grow(
    sizes: list[int], first: int, then: int | None
) -> None:
    length = np.asarray(sizes, dtype=np.int64)
    bounds = chunk_bounds(length, first, then)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(length)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert all(lo < hi for lo, hi in bounds) or len(length) == 0
    # Every chunk but the last reaches its share: first, then, 2 * then, 4 * then, ...
    ends = np.cumsum(length) if len(length) else np.zeros(0, dtype=np.int64)
    target, step = 0, then or first
    for k, (_, hi) in enumerate(bounds[:-1]):
        target += first if k == 0 else step << (k - 1)
        assert int(ends[hi - 1]) >= target
    assert chunk_bounds(length, None) == [(0, len(length))]
    assert bounds == naive_bounds(sizes, first, then)


def naive_bounds(sizes: list[int], first: int, then: int | None = None) -> list[tuple[int, int]]:
    """Chunks cut after the first descriptor that reaches each of first, first + then,
    first + 3 then, first + 7 then, ... bytes (those below the total; ``then`` is ``first``
    when None), found one descriptor at a time."""
    targets, target, step = [], first, then or first
    while target < sum(sizes):
        targets.append(target)
        target, step = target + step, step * 2
    edges, total = [0], 0
    for i, size in enumerate(sizes[:-1]):
        total += size
        while targets and total >= targets[0]:
            targets.pop(0)
            if edges[-1] != i + 1:
                edges.append(i + 1)
    return list(itertools.pairwise([*edges, len(sizes)])) if sizes else [(0, 0)]


def test_host_runs_need_no_sort_when_slots_come_page_major() -> None:
    """Slots laid out whole, descriptors page by page: runs found in order, the same as
    :func:`host_spans` finds by sorting; fragment-major order breaks every descriptor."""
    pages, layers, fragment = 6, 4, 128
    slots = np.asarray([3, 4, 5, 0, 9, 1])  # 3-4-5 stored together
    p, layer = np.divmod(np.arange(pages * layers), layers)
    host = (slots[p] * layers + layer) * fragment
    length = np.full(len(host), fragment, dtype=np.int64)
    assert host_runs(host, length) == 4  # [3, 4, 5], [0], [9], [1]
    assert host_spans(host, length)[0] == 3  # sorted: [0, 1], [3, 4, 5], [9]
    fragment_major = np.argsort(layer, kind="stable")
    assert host_runs(host[fragment_major], length) == pages * layers


def chunk_plans(slots: Arrays, buffer_bytes: int, first_bytes: int, write: str) -> Iterator[Any]:
    """The staging plan of each chunk of ``slots``, in order, as the transport makes them."""
    host_off, device_off, length = slots
    for lo, hi in chunk_bounds(length, first_bytes):
        plan = plan_staging(
            host_off[lo:hi],
            device_off[lo:hi],
            length[lo:hi],
            buffer_bytes=buffer_bytes,
            write=write,
            checked=True,
        )
        assert plan is not None
        yield plan


@given(scattered_slots(), st.integers(1, 12), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_a_chunked_restore_moves_every_byte_once(
    slots: Arrays, buffer_fragments: int, first_fragments: int, seed: int
) -> None:
    host_off, device_off, length = slots
    fragment = int(length[0])
    assert not overlapping(device_off, length)
    buffer_bytes = buffer_fragments * fragment
    size = int(max(host_off.max(), device_off.max()) + fragment)
    rng = np.random.default_rng(seed)
    host = rng.integers(0, 256, size, dtype=np.uint8)
    pool = np.zeros(size + fragment, dtype=np.uint8)
    expected = pool.copy()
    naive(host_off, device_off, length, host, expected)
    for plan in chunk_plans(slots, buffer_bytes, first_fragments * fragment, "device"):
        replay_restore(plan, host, pool)
    assert np.array_equal(pool, expected)


@given(scattered_slots(), st.integers(1, 12), st.integers(1, 5), st.integers(0, 2**32 - 1))
def test_a_chunked_store_writes_exactly_the_described_host_bytes(
    slots: Arrays, buffer_fragments: int, first_fragments: int, seed: int
) -> None:
    host_off, device_off, length = slots
    fragment = int(length[0])
    assert not overlapping(host_off, length)
    size = int(max(host_off.max(), device_off.max()) + fragment)
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, size + fragment, dtype=np.uint8)
    host = np.full(size, 0xEE, dtype=np.uint8)
    expected = host.copy()
    naive(device_off, host_off, length, pool, expected)
    for plan in chunk_plans(slots, buffer_fragments * fragment, first_fragments * fragment, "host"):
        replay_store(plan, pool, host)
    assert np.array_equal(host, expected)


def test_ranges_near_the_top_of_int64_overlap_as_they_do() -> None:
    """start + length wraps past 2**63 in int64; the check compares the gap to the next start."""
    top = (1 << 63) - 64
    offsets = np.array([top, top + 32], dtype=np.int64)
    assert overlapping(offsets, np.array([100, 8], dtype=np.int64))  # its end wraps
    assert not overlapping(offsets, np.array([32, 8], dtype=np.int64))
