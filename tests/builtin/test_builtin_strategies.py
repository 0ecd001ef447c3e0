"""Tests for kvcr_policy.builtin: batching, windows, thread tuning, fallback, coalescing."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.builtin.batching import FixedBatching, cut_ends, joined, ramp, ranges
from kvcr_policy.builtin.coalescing import Contiguous, NoCoalescing
from kvcr_policy.builtin.fallback import MissFallback, SparseFallback
from kvcr_policy.builtin.thread_tuning import SwitchInterval
from kvcr_policy.config.loading import load_config
from kvcr_policy.config.schema import (
    STRATEGY_SECTIONS,
    BatchingSection,
    CoalescingSection,
    FallbackSection,
    ThreadTuningSection,
)
from kvcr_policy.config.selection import bundled_profiles
from kvcr_policy.descriptors import Descriptors
from kvcr_policy.registry import NoOptions, Registry
from kvcr_policy.strategies import (
    AdmissionStrategy,
    BatchingStrategy,
    CoalescingStrategy,
    EvictionStrategy,
    FallbackStrategy,
    PlacementStrategy,
    ThreadTuningStrategy,
    Window,
)
from tests.strategies import descriptors

NO = NoOptions()
ALL = frozenset({"coalesce", "split"})
PROTOCOLS = {
    "batching": BatchingStrategy,
    "coalescing": CoalescingStrategy,
    "placement": PlacementStrategy,
    "thread_tuning": ThreadTuningStrategy,
    "fallback": FallbackStrategy,
    "eviction": EvictionStrategy,
    "admission": AdmissionStrategy,
}


@pytest.mark.parametrize("profile", sorted(bundled_profiles()))
def test_bundled_profiles_build_every_strategy(profile: str, registry: Registry) -> None:
    config = load_config(profile, environ={}, registry=registry).config
    for section_name, kind in STRATEGY_SECTIONS.items():
        section = getattr(config, section_name)
        built = registry.get(kind, section.strategy).create(section, options=section.options)
        assert isinstance(built, PROTOCOLS[kind]), (kind, section.strategy)


# --- batching ---


def _flatten(batches: list[tuple[int, int]]) -> list[int]:
    return [i for start, stop in batches for i in range(start, stop)]


@given(total=st.integers(0, 3000), size=st.integers(1, 300))
def test_ranges_cover_once_in_order_within_bounds(total: int, size: int) -> None:
    batches = ranges(total, size)
    assert _flatten(batches) == list(range(total))
    assert all(0 < stop - start <= size for start, stop in batches)
    assert len(batches) == -(-total // size)


@given(
    pages=st.integers(0, 2000),
    keys=st.integers(0, 2000),
    read=st.integers(1, 256),
    query=st.integers(1, 256),
)
def test_fixed_batching_reads_and_queries(pages: int, keys: int, read: int, query: int) -> None:
    batching = FixedBatching(BatchingSection(read_batch_pages=read, query_batch_keys=query), NO)
    reads, queries = batching.read_batches(pages), batching.query_batches(keys)
    assert _flatten(reads) == list(range(pages))
    assert _flatten(queries) == list(range(keys))
    assert all(stop - start <= read for start, stop in reads)
    assert all(stop - start <= query for start, stop in queries)


def test_fixed_batching_defaults_are_upstream() -> None:
    batching = FixedBatching(BatchingSection(), NO)
    assert batching.read_batches(300) == [(0, 128), (128, 256), (256, 300)]
    assert batching.query_batches(129) == [(0, 128), (128, 129)]
    assert not batching.window.bounded


@given(pages=st.integers(0, 3000), read=st.integers(1, 300), first=st.integers(1, 300))
def test_first_batch_pages_ramps_up_to_read_batch_pages(pages: int, read: int, first: int) -> None:
    section = BatchingSection(read_batch_pages=read, first_batch_pages=first)
    first = min(first, read)
    reads = FixedBatching(section, NO).read_batches(pages)
    assert _flatten(reads) == list(range(pages))
    sizes = [stop - start for start, stop in reads]
    # Each whole batch is twice the one before, up to read_batch_pages; only the last is cut.
    whole = [min(first * 2**i, read) for i in range(len(sizes))]
    assert sizes[:-1] == whole[:-1]
    assert all(0 < size <= whole[-1] for size in sizes[-1:])


def test_first_batch_pages_unset_keeps_fixed_batches() -> None:
    section = BatchingSection(read_batch_pages=256)
    assert section.first_batch_pages is None
    assert FixedBatching(section, NO).read_batches(600) == ranges(600, 256)
    ramped = BatchingSection(read_batch_pages=256, first_batch_pages=32)
    assert FixedBatching(ramped, NO).read_batches(600) == [
        (0, 32),
        (32, 96),
        (96, 224),
        (224, 480),
        (480, 600),
    ]


def test_first_batch_pages_above_read_batch_pages_is_read_batch_pages() -> None:
    """A profile's first batch stays valid under a smaller read_batch_pages set over it."""
    section = BatchingSection(read_batch_pages=16, first_batch_pages=32)
    assert FixedBatching(section, NO).read_batches(40) == ranges(40, 16)


@given(
    total=st.integers(0, 3000),
    size=st.integers(1, 300),
    first=st.none() | st.integers(1, 300),
    least=st.integers(0, 1000),
)
def test_joined_batches_keep_every_boundary_and_hold_the_least(
    total: int, size: int, first: int | None, least: int
) -> None:
    cut = ranges(total, size) if first is None else ramp(total, first, size)
    batches = joined(cut, least)
    assert _flatten(batches) == list(range(total))  # every page once, in order
    boundaries = {stop for _, stop in cut}
    assert all(stop in boundaries for _, stop in batches)  # no strategy batch is cut
    assert all(stop - start >= least for start, stop in batches[:-1])
    # Joined no further than needed: without its last strategy batch, a joined one is short.
    for start, stop in batches[:-1]:
        inner = [s for s, e in cut if start <= s and e <= stop]
        assert max(inner) - start < max(least, 1)


@given(total=st.integers(0, 3000), size=st.integers(1, 300), ends=st.none() | st.integers(1, 400))
def test_cut_ends_make_the_first_and_last_pages_batches_of_their_own(
    total: int, size: int, ends: int | None
) -> None:
    cut = ranges(total, size)
    batches = cut_ends(cut, ends)
    assert _flatten(batches) == list(range(total))  # every page once, in order
    stops, boundaries = {stop for _, stop in batches}, {stop for _, stop in cut}
    assert boundaries <= stops and len(stops - boundaries) <= 2  # two cuts at most, no joins
    if ends is not None and batches:
        assert batches[0][1] - batches[0][0] == min(ends, cut[0][1] - cut[0][0])
        assert batches[-1][1] - batches[-1][0] <= ends


def test_cut_ends_leave_short_ends_alone() -> None:
    assert cut_ends([(0, 256)], None) == [(0, 256)]
    assert cut_ends([(0, 256)], 64) == [(0, 64), (64, 192), (192, 256)]
    assert cut_ends([(0, 100)], 64) == [(0, 64), (64, 100)]  # the rest is no longer than 64
    assert cut_ends([(0, 64)], 64) == [(0, 64)]
    assert cut_ends([(0, 1024), (1024, 1100)], 64) == [(0, 64), (64, 1024), (1024, 1036),
                                                        (1036, 1100)]  # fmt: skip
    assert cut_ends([(0, 1024), (1024, 1050)], 64) == [(0, 64), (64, 1024), (1024, 1050)]
    assert cut_ends([], 64) == []


def test_joined_with_no_least_is_the_strategys_batches() -> None:
    assert joined(ranges(600, 256), 1) == ranges(600, 256)
    assert joined(ranges(600, 256), 0) == ranges(600, 256)
    assert joined(ranges(2048, 256), 1024) == [(0, 1024), (1024, 2048)]
    assert joined(ranges(1100, 256), 1024) == [(0, 1024), (1024, 1100)]


def test_fixed_batching_window_comes_from_the_section() -> None:
    section = BatchingSection(window_batches=2, window_pages=256, window_bytes="1GiB")
    assert FixedBatching(section, NO).window == Window(2, 256, 1 << 30)


@given(
    bounds=st.tuples(
        st.none() | st.integers(1, 6),
        st.none() | st.integers(1, 160),
        st.none() | st.integers(1, 4096),
    ),
    batches=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 1000)), max_size=30),
)
def test_window_never_exceeds_its_bounds(
    bounds: tuple[int | None, int | None, int | None], batches: list[tuple[int, int]]
) -> None:
    """Admit batches greedily: in flight stays within bounds unless one batch runs alone."""
    window = Window(*bounds)
    limit_batches, limit_pages, limit_bytes = bounds
    flight: list[tuple[int, int]] = []
    for pages, nbytes in batches:
        in_pages = sum(p for p, _ in flight)
        in_bytes = sum(b for _, b in flight)
        admitted = window.admits(len(flight), in_pages, in_bytes, pages, nbytes)
        fits = (
            (limit_batches is None or len(flight) + 1 <= limit_batches)
            and (limit_pages is None or in_pages + pages <= limit_pages)
            and (limit_bytes is None or in_bytes + nbytes <= limit_bytes)
        )
        assert admitted == (not flight or fits)
        if admitted:
            flight.append((pages, nbytes))
        else:
            flight.pop(0)  # the oldest completes; the refused batch is dropped in this model
        if len(flight) > 1:
            assert limit_batches is None or len(flight) <= limit_batches
            assert limit_pages is None or sum(p for p, _ in flight) <= limit_pages
            assert limit_bytes is None or sum(b for _, b in flight) <= limit_bytes


def test_empty_window_admits_an_oversized_batch() -> None:
    assert Window(1, 4, 10).admits(0, 0, 0, 100, 1000)
    assert not Window(1, 4, 10).admits(1, 1, 1, 1, 1)


# --- thread tuning ---


@pytest.fixture
def switch_interval() -> Iterator[float]:
    before = sys.getswitchinterval()
    yield before
    sys.setswitchinterval(before)


def test_thread_tuning_sets_and_restores(
    switch_interval: float, caplog: pytest.LogCaptureFixture
) -> None:
    tuning = SwitchInterval(ThreadTuningSection(switch_interval_s=0.0005), NO)
    with caplog.at_level(logging.INFO, logger="kvcr_policy.thread_tuning"):
        tuning.apply()
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        tuning.apply()  # idempotent: the first previous value is kept
        tuning.restore()
    assert sys.getswitchinterval() == pytest.approx(switch_interval)
    assert f"switch interval {switch_interval:.6f} s -> 0.000500 s" in caplog.text
    assert f"0.000500 s -> {switch_interval:.6f} s (restored)" in caplog.text


def test_thread_tuning_default_touches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    monkeypatch.setattr(sys, "setswitchinterval", calls.append)
    tuning = SwitchInterval(ThreadTuningSection(), NO)
    tuning.apply()
    tuning.restore()
    assert calls == []


def test_thread_tuning_keeps_a_newer_change(switch_interval: float) -> None:
    tuning = SwitchInterval(ThreadTuningSection(switch_interval_s=0.0005), NO)
    tuning.apply()
    sys.setswitchinterval(0.002)  # someone else changed it while we were open
    tuning.restore()
    assert sys.getswitchinterval() == pytest.approx(0.002)


# --- fallback ---


@given(
    outcomes=st.lists(
        st.lists(st.sampled_from(("ok", "fail", "raise")), min_size=1, max_size=3), max_size=40
    ),
    retries=st.integers(0, 3),
)
def test_sparse_fallback_returns_exactly_the_pages_that_arrived(
    outcomes: list[list[str]], retries: int
) -> None:
    """Page i's attempts go through outcomes[i] in turn (the last one repeats)."""
    attempts = [0] * len(outcomes)

    def retry_page(page: int) -> bool:
        sequence = outcomes[page]
        outcome = sequence[min(attempts[page], len(sequence) - 1)]
        attempts[page] += 1
        if outcome == "raise":
            raise OSError("transfer failed again")
        return outcome == "ok"

    ok = SparseFallback(FallbackSection(max_retries=retries), NO).recover(len(outcomes), retry_page)
    expected = ["ok" in (seq + [seq[-1]] * retries)[:retries] for seq in outcomes]
    assert ok.dtype == np.bool_
    assert ok.tolist() == expected
    assert all(n <= retries for n in attempts)


def test_miss_fallback_never_retries() -> None:
    def retry_page(page: int) -> bool:
        raise AssertionError("miss must not retry")

    ok = MissFallback(FallbackSection(strategy="miss"), NO).recover(5, retry_page)
    assert ok.tolist() == [False] * 5


# --- coalescing ---


def _byte_map(d: Descriptors) -> list[tuple[int, int]]:
    """(src byte, dst byte) for every byte moved, in order."""
    return [
        (s + i, t + i)
        for s, t, n in zip(d.src.tolist(), d.dst.tolist(), d.length.tolist(), strict=True)
        for i in range(n)
    ]


@pytest.mark.parametrize("cls", [NoCoalescing, Contiguous])
@given(
    d=descriptors(),
    split=st.none() | st.integers(1, 12),
    allowed=st.sets(st.sampled_from(sorted(ALL))),
)
def test_coalescing_moves_the_same_bytes_using_only_allowed_capabilities(
    cls: type[NoCoalescing], d: Descriptors, split: int | None, allowed: set[str]
) -> None:
    strategy = cls(CoalescingSection(split_bytes=split), NO)
    out = strategy.prepare(d, frozenset(allowed))
    assert _byte_map(out) == _byte_map(d)
    if "coalesce" not in allowed or cls is NoCoalescing:
        # Without coalescing, every input descriptor survives (possibly cut into pieces).
        assert len(out) >= len(d)
    if split is not None and "split" in allowed:
        assert all(n <= split for n in out.length.tolist())
    if not allowed:
        assert out is d


def test_none_coalescing_needs_only_split() -> None:
    assert NoCoalescing(CoalescingSection(), NO).needs == frozenset()
    assert NoCoalescing(CoalescingSection(split_bytes=8), NO).needs == {"split"}
    assert Contiguous(CoalescingSection(), NO).needs == {"coalesce"}
    assert Contiguous(CoalescingSection(split_bytes=8), NO).needs == ALL


def test_contiguous_merges_runs_within_a_bound_only() -> None:
    d = Descriptors.from_arrays([0, 4, 8, 20], [0, 4, 8, 12], [4, 4, 4, 4], bound=[0, 0, 1, 1])
    out = Contiguous(CoalescingSection(strategy="contiguous"), NO).prepare(d, ALL)
    assert out.src.tolist() == [0, 8, 20]
    assert out.length.tolist() == [8, 4, 4]
    unchanged = NoCoalescing(CoalescingSection(), NO).prepare(d, ALL)
    assert unchanged.src.tolist() == [0, 4, 8, 20]


def test_split_is_skipped_when_the_transport_cannot() -> None:
    d = Descriptors.from_arrays([0], [0], [100])
    strategy = Contiguous(CoalescingSection(split_bytes=30), NO)
    assert strategy.prepare(d, frozenset({"coalesce"})).length.tolist() == [100]
    assert strategy.prepare(d, ALL).length.tolist() == [30, 30, 30, 10]
