"""Tests for the staging ring's plan and choice (numpy only, no GPU needed).

The plan is checked by replaying it on host memory exactly as the GPU runs it: each fill's
pieces copied into one buffer, then the buffer's rows scattered by the plan's row indices
(or, for stores, gathered then copied out). The CUDA data path itself is tested, byte for
byte, in test_cuda.py (skipped without a GPU).
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.backends.dram.transports.cuda_chunks import host_runs
from kvcr_policy.backends.dram.transports.cuda_plan import (
    MAX_ROW_BYTES,
    StagingPlan,
    _few_pieces,
    fill_pieces,
    host_spans,
    page_pieces,
    plan_staging,
    row_unit,
    stage,
)
from tests.strategies import scattered_slots

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]


def replay_restore(plan: StagingPlan, host: np.ndarray, pool: np.ndarray) -> None:
    """What :meth:`StagingRing.restore` enqueues, on host memory: fill by fill."""
    rows = pool.reshape(-1, plan.unit)
    for j in range(plan.buffers):
        buffer = np.full(plan.capacity, 0x5A, dtype=np.uint8)
        for offset, at, n in plan.pieces[plan.fills[j] : plan.fills[j + 1]]:
            buffer[offset : offset + n] = host[at : at + n]
        lo, hi = plan.fill_rows(j)
        rows[plan.rows[lo:hi]] = buffer.reshape(-1, plan.unit)[: hi - lo]


def replay_store(plan: StagingPlan, pool: np.ndarray, host: np.ndarray) -> None:
    rows = pool.reshape(-1, plan.unit)
    for j in range(plan.buffers):
        buffer = np.full(plan.capacity, 0x5A, dtype=np.uint8)
        lo, hi = plan.fill_rows(j)
        buffer.reshape(-1, plan.unit)[: hi - lo] = rows[plan.rows[lo:hi]]
        for offset, at, n in plan.pieces[plan.fills[j] : plan.fills[j + 1]]:
            host[at : at + n] = buffer[offset : offset + n]


def naive(src_off: np.ndarray, dst_off: np.ndarray, length: np.ndarray, src: np.ndarray,
          dst: np.ndarray) -> None:  # fmt: skip
    for s, d, n in zip(src_off, dst_off, length, strict=True):
        dst[d : d + n] = src[s : s + n]


def restored(plan: StagingPlan, descriptors: Arrays, seed: int) -> np.ndarray:
    """A pool restored by replaying ``plan`` from random host bytes, checked against one copy
    per descriptor; returns it."""
    host_off, device_off, length = descriptors
    size = int(max((host_off + length).max(), (device_off + length).max()))
    host = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    pool = np.zeros(size + plan.unit, dtype=np.uint8)
    expected = pool.copy()
    naive(host_off, device_off, length, host, expected)
    replay_restore(plan, host, pool)
    assert np.array_equal(pool, expected)
    return pool


@given(scattered_slots(), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_a_restore_plan_moves_every_byte_once_within_the_ring(
    slots: Arrays, buffer_fragments: int, seed: int
) -> None:
    host_off, device_off, length = slots
    fragment = int(length[0])
    buffer_bytes = max(1, buffer_fragments * fragment // 3)
    plan = plan_staging(host_off, device_off, length, buffer_bytes=buffer_bytes, write="device")
    assert plan is not None
    # Bounded: every piece lies inside one buffer, no fill uses more than the buffer.
    assert plan.capacity <= buffer_bytes and plan.capacity % plan.unit == 0
    offset, _, n = plan.pieces.T
    assert np.all(n > 0) and np.all(offset + n <= plan.capacity)
    assert plan.unit <= MAX_ROW_BYTES and np.all(device_off % plan.unit == 0)
    assert plan.nbytes == int(length.sum())
    restored(plan, (host_off, device_off, length), seed)


@given(scattered_slots(), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_a_store_plan_writes_exactly_the_described_host_bytes(
    slots: Arrays, buffer_fragments: int, seed: int
) -> None:
    host_off, device_off, length = slots
    buffer_bytes = max(1, buffer_fragments * int(length[0]) // 2)
    plan = plan_staging(host_off, device_off, length, buffer_bytes=buffer_bytes, write="host")
    assert plan is not None
    size = int(max(host_off.max(), device_off.max()) + length[0])
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, size + plan.unit, dtype=np.uint8)
    host = np.full(size, 0xEE, dtype=np.uint8)
    expected = host.copy()
    naive(device_off, host_off, length, pool, expected)
    replay_store(plan, pool, host)
    assert np.array_equal(host, expected)  # bytes outside the descriptors untouched


@st.composite
def mixed_ranges(draw: st.DrawFn) -> tuple[Arrays, bool]:
    """``((host, device, length), overlaps)``: descriptors of several lengths (whole multiples
    of a row, as coalesced runs are), laid end to end in a random order on each side (with
    gaps on the device side, sometimes wide: rows far apart), maybe with one device range
    written twice."""
    unit = draw(st.sampled_from((8, 24, 4096)))
    counts = draw(st.lists(st.integers(1, 4), min_size=1, max_size=12))
    length = np.asarray(counts, dtype=np.int64) * unit
    host_order = draw(st.permutations(range(len(counts))))
    device_order = draw(st.permutations(range(len(counts))))
    gaps = draw(st.lists(st.sampled_from((0, 0, 1, 5000)), min_size=len(counts),
                         max_size=len(counts)))  # fmt: skip
    host, device = np.zeros(len(counts), np.int64), np.zeros(len(counts), np.int64)
    at = 0
    for i in host_order:
        host[i], at = at, at + int(length[i])
    at = 0
    for k, i in enumerate(device_order):
        at += gaps[k] * unit
        device[i], at = at, at + int(length[i])
    overlaps = len(counts) > 1 and draw(st.booleans())
    if overlaps:  # the last range written again over the first one's first row
        device[-1] = device[0]
    return (host, device, length), overlaps


@given(mixed_ranges(), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_plans_of_mixed_lengths_move_the_described_bytes(
    case: tuple[Arrays, bool], buffer_rows: int, seed: int
) -> None:
    (host_off, device_off, length), overlaps = case
    unit = int(np.gcd.reduce(length))
    plan = plan_staging(host_off, device_off, length, buffer_bytes=buffer_rows * unit,
                        write="device")  # fmt: skip
    if overlaps:  # one device byte written twice: order matters, so another path
        assert plan is None
        return
    assert plan is not None and plan.nbytes == int(length.sum())
    pool = restored(plan, (host_off, device_off, length), seed)
    size = len(pool) - plan.unit
    store = plan_staging(host_off, device_off, length, buffer_bytes=buffer_rows * unit,
                         write="host")  # fmt: skip
    assert store is not None
    back = np.full(size, 0xEE, dtype=np.uint8)
    expected = back.copy()
    naive(device_off, host_off, length, pool, expected)
    replay_store(store, pool, back)
    assert np.array_equal(back, expected)


def test_whole_slots_cross_as_one_piece_each() -> None:
    """qwen3-32b-like: 64 fragments of 128 KiB per 8 MiB slot, slots scattered over a tier four
    times larger; 32 MiB ring buffers take four slots per fill, one host copy per host run (a
    run cut only where a fill ends), the runs taken in the order given."""
    pages, layers, fragment = 16, 64, 128 << 10
    slots = np.random.default_rng(3).choice(4 * pages, pages, replace=False)  # a tier 4x larger
    p, layer = np.divmod(np.arange(pages * layers), layers)
    host = (slots[p] * layers + layer) * fragment
    device = (layer * pages + p) * fragment
    length = np.full(len(host), fragment)
    plan = plan_staging(host, device, length, buffer_bytes=32 << 20, write="device")
    assert plan is not None
    spans, nbytes = host_spans(host, length)
    assert nbytes == pages * layers * fragment and spans <= pages
    # Runs in the order given (page by page): slots adjacent only in host order stay apart.
    assert plan.unit == fragment and plan.buffers == 4 and plan.spans == host_runs(host, length)
    assert spans <= plan.spans <= pages
    assert plan.spans <= len(plan.pieces) <= plan.spans + plan.buffers - 1  # cut at fill ends


def test_overlapping_writes_take_another_path() -> None:
    host = np.array([0, 100], dtype=np.int64)
    device = np.array([0, 50], dtype=np.int64)
    length = np.array([100, 100], dtype=np.int64)
    assert plan_staging(host, device, length, buffer_bytes=64, write="device") is None
    assert plan_staging(host, device, length, buffer_bytes=64, write="host") is not None
    assert plan_staging(device, host, length, buffer_bytes=64, write="host") is None
    empty = np.zeros(0, dtype=np.int64)
    assert plan_staging(empty, empty, empty, buffer_bytes=64, write="device") is None


@given(st.lists(st.integers(0, 12), min_size=1, max_size=10), st.sampled_from((1, 3, 8)))
def test_a_store_plan_of_one_length_is_refused_where_host_ranges_overlap(
    starts: list[int], size: int
) -> None:
    """Pieces of one length (a pool's fragments) in any host order: a store plan writes each
    host byte once, so it is made exactly when no two host ranges share a byte."""
    host = np.asarray(starts, dtype=np.int64) * 4  # some apart, some touching or overlapping
    device = np.arange(len(host), dtype=np.int64) * size
    length = np.full(len(host), size, dtype=np.int64)
    ranges = sorted(starts)
    overlap = any(b * 4 - a * 4 < size for a, b in itertools.pairwise(ranges))
    plan = plan_staging(host, device, length, buffer_bytes=4 * size, write="host")
    assert (plan is None) == overlap
    if plan is not None:
        pool = np.random.default_rng(len(starts)).integers(0, 256, len(host) * size + plan.unit,
                                                            dtype=np.uint8)  # fmt: skip
        back = np.full(int(host.max()) + size, 0xEE, dtype=np.uint8)
        expected = back.copy()
        naive(device, host, length, pool, expected)
        replay_store(plan, pool, back)
        assert np.array_equal(back, expected)


@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 40)), min_size=1, max_size=20),
       st.integers(1, 16))  # fmt: skip
def test_fill_pieces_cut_runs_exactly_at_fill_ends(
    runs: list[tuple[int, int]], capacity: int
) -> None:
    """Runs of descriptors (never empty: the bounds refuse those) laid end to end in staging, a
    few cut one by one, many in arrays: each fill's pieces cover its staging bytes in order,
    each piece within one fill, from the right host bytes."""
    hosts = np.asarray([host for host, _ in runs], dtype=np.int64)
    sizes = np.asarray([size for _, size in runs], dtype=np.int64)
    linears = np.cumsum(sizes) - sizes
    pieces, fills = fill_pieces(hosts, linears, sizes, capacity)
    expected = [  # staging byte -> host byte, byte by byte
        int(hosts[i]) + k for i in range(len(runs)) for k in range(int(sizes[i]))
    ]
    got = []
    assert fills[0] == 0 and fills[-1] == len(pieces) and np.all(np.diff(fills) > 0)
    for j in range(len(fills) - 1):
        for offset, host, n in pieces[fills[j] : fills[j + 1]].tolist():
            assert n > 0 and offset + n <= capacity
            assert len(got) == j * capacity + offset  # in order, no gap within the fill
            got += range(host, host + n)
    assert got == expected


@given(
    st.lists(st.integers(0, 1 << 20), min_size=1, max_size=80),
    st.integers(1, 64),
    st.integers(1, 40),
    st.booleans(),
)
def test_whole_runs_of_one_size_are_cut_as_the_loop_cuts_them(
    hosts: list[int], size: int, per: int, divides: bool
) -> None:
    """Runs of one size end to end (a whole-slot tier's scattered pages) take the short path
    where their size divides the fill, and it gives the pieces and fills the one-at-a-time
    cut gives, past any number of runs; where it does not divide, the general cut does."""
    span_host = np.asarray(hosts, dtype=np.int64)
    span_bytes = np.full(len(hosts), size, dtype=np.int64)
    span_linear = np.arange(len(hosts), dtype=np.int64) * size
    capacity = per * size if divides else per * size + size // 2 + 1
    pieces, fills = fill_pieces(span_host, span_linear, span_bytes, capacity)
    want_pieces, want_fills = _few_pieces(hosts, span_linear.tolist(), [size] * len(hosts),
                                          capacity)  # fmt: skip
    assert np.array_equal(pieces, want_pieces) and np.array_equal(fills, want_fills)


def test_host_spans_count_contiguous_runs_in_host_order() -> None:
    host = np.array([30, 0, 10, 50], dtype=np.int64)
    length = np.full(4, 10, dtype=np.int64)
    assert host_spans(host, length) == (3, 40)  # [0, 20), [30, 40), [50, 60)
    assert host_spans(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)) == (0, 0)


MiB = 1 << 20
CHOICE = {"below_bytes": 2 * MiB, "min_descriptors": 64, "min_span_bytes": 4 * MiB}


def test_auto_stages_fragmented_batches_of_whole_slots_only() -> None:
    """Decisions from injected batch shapes (no GPU, no timing)."""
    scattered = {"descriptors": 4096, "nbytes": 4096 * 128 << 10, "spans": 32}  # 16 MiB slots
    assert stage("auto", **scattered, **CHOICE)
    # The contiguous case: 128 large coalesced descriptors keep their copies.
    coalesced = {"descriptors": 128, "nbytes": 128 * 64 * MiB, "spans": 1}
    assert not stage("auto", **coalesced, **CHOICE)
    # Host runs as short as the fragments (nothing to gain from whole-run copies).
    fragments = {"descriptors": 4096, "nbytes": 4096 * 128 << 10, "spans": 4096}
    assert not stage("auto", **fragments, **CHOICE)
    few = {"descriptors": 8, "nbytes": 8 * 128 << 10, "spans": 1}
    assert not stage("auto", **few, **CHOICE)
    assert stage("always", **few, **CHOICE) and stage("always", **fragments, **CHOICE)
    assert not stage("never", **scattered, **CHOICE)
    assert not stage("always", descriptors=0, nbytes=0, spans=0, **CHOICE)


@given(
    st.integers(1, 12),
    st.integers(1, 6),
    st.sampled_from((8, 24, 72, 4096, 3 << 20)),
    st.integers(1, 40),
    st.data(),
)
def test_the_pieces_read_ahead_are_the_plans_fills_of_the_same_pages(
    pages: int, layers: int, fragment: int, buffer_fragments: int, data: st.DataObject
) -> None:
    """The ring's read-ahead finds a batch's fills from its pages' slots alone: for pages in
    any order, slots consecutive or scattered, the fills of :func:`page_pieces` are exactly
    those :func:`plan_staging` plans for the batch (page by page, fragment by fragment from a
    whole-slot tier), so the batch adopts them."""
    slots = np.asarray(data.draw(st.permutations(range(2 * pages)))[:pages], dtype=np.int64)
    if data.draw(st.booleans()):
        slots = np.sort(slots)  # a prefix stored together: consecutive slots join
    page_bytes = layers * fragment
    p, layer = np.divmod(np.arange(pages * layers, dtype=np.int64), layers)
    host = slots[p] * page_bytes + layer * fragment
    device = (layer * pages + p) * fragment
    length = np.full(len(host), fragment, dtype=np.int64)
    buffer_bytes = max(1, buffer_fragments * fragment // 3)
    plan = plan_staging(host, device, length, buffer_bytes=buffer_bytes, write="device")
    assert plan is not None
    unit = row_unit(fragment, buffer_bytes)
    assert plan.unit == unit
    capacity = buffer_bytes // unit * unit
    pieces, fills = page_pieces(slots * page_bytes, page_bytes, capacity)
    assert np.array_equal(pieces, plan.pieces) and np.array_equal(fills, plan.fills)


def test_row_units_divide_the_buffer_and_stay_below_the_kernel_bound() -> None:
    assert row_unit(128 << 10, 32 << 20) == 128 << 10
    assert row_unit(3 << 20, 32 << 20) == 3 << 18  # halved until at most 1 MiB
    assert row_unit(48, 32) == 16  # cut to divide the buffer
    assert row_unit(73728, 32 << 20) == 73728  # MLA 576 x 64 tokens: no power of two
