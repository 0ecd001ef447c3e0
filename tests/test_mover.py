"""Tests of kvcr_policy.mover, through the pipeline: descriptor coalescing, delivery windows,
fallback strategies and failed batches, with real bytes in small pools.

Speed is never asserted; the tier is kept small with ``placement.capacity_bytes``.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from kvcr_policy.backends.dram.transports.base import CopyBatch
from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.errors import UnsupportedError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.pipeline import Pipeline
from tests.support.pipelines import (
    LAYOUT_CASES,
    LAYOUT_IDS,
    Build,
    TrackingTransport,
    after_restore,
    build,
    expected_planes,
    geometry,
    keep_switch_interval,
    pool_pages,
    same_bytes,
    store_stats,
    stored_pool,
)
from tests.support.pools import (
    P,
    copy_buffer,
    keys_of,
    page_bytes,
    random_buffer,
    scramble,
    token_indices,
)

__all__ = ["build", "keep_switch_interval"]  # the rig's fixtures, used here


# ---- coalescing ---------------------------------------------------------------------------


@pytest.mark.parametrize(("layout", "mla"), LAYOUT_CASES, ids=LAYOUT_IDS)
@pytest.mark.parametrize("split_bytes", [None, 100])
def test_contiguous_prefix_coalesces_to_one_descriptor_per_plane_per_batch(
    build: Build, layout: str, mla: bool, split_bytes: int | None
) -> None:
    geo = geometry(layout, mla=mla, pages=32)
    rng = np.random.default_rng(6)
    buf = random_buffer(geo, rng, "numpy-float16")
    original = copy_buffer(buf)
    batch, n = 4, 10
    # The strategy's batches as they are (no read_batch_bytes joining them).
    overrides: dict[str, Any] = {
        "batching.read_batch_pages": batch,
        "batching.read_batch_bytes": None,
    }
    if split_bytes is not None:
        overrides["coalescing.split_bytes"] = split_bytes
    pipeline = build("throughput", overrides)
    pipeline.register_pool("kv", geo, buf)

    planes = expected_planes(layout, mla)
    fragment = (1 if mla else 2) * 3 * (1 if mla else 2) * 8 * 2 * P // planes
    sizes = [min(batch, n - start) for start in range(0, n, batch)]  # 4, 4, 2
    if split_bytes is None:
        per_call = planes * len(sizes)
    else:  # each coalesced plane run of m pages is cut into ceil(m·fragment / split) pieces
        per_call = sum(planes * math.ceil(m * fragment / split_bytes) for m in sizes)

    assert pipeline.set(keys_of("k", n), token_indices(range(3, 3 + n), P)) == [True] * n
    stats = pipeline.stats()
    assert (stats.descriptors_before, stats.descriptors_after) == (planes * n, per_call)
    assert stats.batches == len(sizes)

    scramble(buf, rng)
    before = copy_buffer(buf)
    assert pipeline.get(keys_of("k", n), token_indices(range(20, 20 + n), P)) == [True] * n
    stats = pipeline.stats()
    assert (stats.descriptors_before, stats.descriptors_after) == (2 * planes * n, 2 * per_call)
    pairs = [(3 + i, 20 + i) for i in range(n)]
    assert same_bytes(buf, after_restore(before, original, geo, pairs))


@pytest.mark.parametrize(("layout", "mla"), LAYOUT_CASES, ids=LAYOUT_IDS)
def test_default_profile_sends_one_descriptor_per_fragment(
    build: Build, layout: str, mla: bool
) -> None:
    geo = geometry(layout, mla=mla, pages=32)
    buf = random_buffer(geo, np.random.default_rng(7), "numpy-float16")
    pipeline = build()
    pipeline.register_pool("kv", geo, buf)
    n = 10
    pipeline.set(keys_of("k", n), token_indices(range(n), P))
    pipeline.get(keys_of("k", n), token_indices(range(10, 10 + n), P))
    stats = pipeline.stats()
    planes = expected_planes(layout, mla)
    assert stats.descriptors_before == stats.descriptors_after == 2 * planes * n


class PlainTransport(MemoryTransport):
    """A memory transport that can neither coalesce nor split."""

    name = "plain"
    capabilities = frozenset()


def test_coalescing_falls_back_to_plain_descriptors_on_a_transport_without_it(
    build: Build,
) -> None:
    pipeline, geo, *_ = stored_pool(build, "throughput", transport=PlainTransport())
    stats = pipeline.stats()
    assert stats.descriptors_after == stats.descriptors_before == 8 * geo.fragments_per_page
    assert pipeline.allowed == frozenset()


def test_coalescing_on_unsupported_error_refuses_to_build(build: Build) -> None:
    with pytest.raises(UnsupportedError, match="on_unsupported"):
        build("throughput", {"coalescing.on_unsupported": "error"}, transport=PlainTransport())


# ---- windows and delivery -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("window", "peak_batches", "peak_pages"),
    [
        ({}, 5, 10),  # unbounded: every batch is issued before the first completes
        ({"batching.window_batches": 1}, 1, 2),
        ({"batching.window_batches": 3}, 3, 6),
        ({"batching.window_pages": 4}, 2, 4),
        ({"batching.window_pages": 5}, 2, 4),
        ({"batching.window_bytes": 3 * 2 * 768}, 3, 6),
        ({"batching.window_bytes": 3 * 2 * 768 - 1}, 2, 4),
    ],
    ids=["unbounded", "batches1", "batches3", "pages4", "pages5", "bytes3", "bytes<3"],
)
def test_windows_bound_what_is_in_flight(
    build: Build, window: dict[str, int], peak_batches: int, peak_pages: int
) -> None:
    overrides = {"batching.read_batch_pages": 2, **window}
    pipeline, geo, buf, original, keys = stored_pool(build, overrides=overrides, n=10)
    assert geo.page_bytes == 768
    stats = pipeline.stats()
    assert stats.batches == 5
    assert stats.peak_inflight_batches == peak_batches
    assert stats.peak_inflight_bytes == peak_pages * geo.page_bytes

    ready: list[int] = []
    scramble(buf, np.random.default_rng(8))
    before = copy_buffer(buf)
    assert pipeline.get(keys, token_indices(range(20, 30), P), on_ready=ready.append) == [True] * 10
    assert ready == [2, 4, 6, 8, 10]
    stats = pipeline.stats()
    assert stats.peak_inflight_batches == peak_batches
    assert stats.peak_inflight_bytes == peak_pages * geo.page_bytes
    assert same_bytes(buf, after_restore(before, original, geo, [(i, 20 + i) for i in range(10)]))


@pytest.mark.parametrize(
    ("least", "sizes"),
    [(None, [2, 2, 2, 2, 2]), (768, [2, 2, 2, 2, 2]), (3 * 768, [4, 4, 2]), ("1GiB", [10])],
    ids=["unset", "one page", "three pages", "more than the call"],
)
def test_batches_are_joined_to_read_batch_bytes(
    build: Build, least: int | str | None, sizes: list[int]
) -> None:
    overrides: dict[str, Any] = {"batching.read_batch_pages": 2}
    if least is not None:
        overrides["batching.read_batch_bytes"] = least
    pipeline, geo, buf, original, keys = stored_pool(build, overrides=overrides, n=10)
    assert geo.page_bytes == 768
    assert pipeline.stats().batches == len(sizes)
    ready: list[int] = []
    scramble(buf, np.random.default_rng(9))
    before = copy_buffer(buf)
    assert pipeline.get(keys, token_indices(range(20, 30), P), on_ready=ready.append) == [True] * 10
    assert ready == list(itertools.accumulate(sizes))
    assert same_bytes(buf, after_restore(before, original, geo, [(i, 20 + i) for i in range(10)]))


def test_on_ready_sees_complete_pages(build: Build) -> None:
    """When on_ready(n) runs, the first n pages already hold their restored bytes."""
    overrides = {"batching.read_batch_pages": 3, "batching.window_batches": 1}
    pipeline, geo, buf, original, keys = stored_pool(build, overrides=overrides, n=8)
    scramble(buf, np.random.default_rng(9))
    dst = [31, 12, 25, 9, 16, 17, 30, 11]
    problems: list[int] = []

    def on_ready(count: int) -> None:
        for i in range(count):
            if page_bytes(buf, geo, dst[i]) != page_bytes(original, geo, i):
                problems.append(i)

    assert pipeline.get(keys, token_indices(dst, P), on_ready=on_ready) == [True] * 8
    assert problems == []


# ---- fallback -----------------------------------------------------------------------------


class Faults:
    """The ``fault`` of a MemoryTransport: ``rule(batch, pool_pages)`` decides each batch.

    ``rule`` returns None (copy all), a descriptor count to stop after, or raises. Every batch's
    pool pages are recorded in ``seen``.
    """

    def __init__(self) -> None:
        self.rule: Callable[[CopyBatch, set[int]], int | None] | None = None
        self.geo: PoolGeometry | None = None
        self.buffer: object = None
        self.seen: list[set[int]] = []

    def __call__(self, batch: CopyBatch) -> int | None:
        assert self.geo is not None
        pages = pool_pages(batch, self.geo, self.buffer)
        self.seen.append(pages)
        return None if self.rule is None else self.rule(batch, pages)


def faulty_pool(
    build: Build, overrides: Mapping[str, Any] | None = None, *, n: int = 10
) -> tuple[Pipeline, Faults, PoolGeometry, np.ndarray, np.ndarray, list[str]]:
    """``stored_pool`` over a MemoryTransport whose faults the test switches on later."""
    faults = Faults()
    faults.geo = geometry(pages=32)
    pipeline, geo, buf, original, keys = stored_pool(
        build, overrides=overrides, n=n, transport=MemoryTransport(fault=faults)
    )
    faults.buffer = buf
    return pipeline, faults, geo, buf, original, keys


def multi_page_cut(k: int) -> Callable[[CopyBatch, set[int]], int | None]:
    """Cut every batch of more than one page after ``k`` descriptors (a per-page retry passes)."""
    return lambda batch, pages: k if len(pages) > 1 else None


@pytest.mark.parametrize("cut", [0, 1, 7, 11])
def test_sparse_fallback_recovers_every_page_of_a_batch_cut_short(build: Build, cut: int) -> None:
    # 6 fragments per page: cut 1 stops inside the first page, 7 and 11 inside the second.
    overrides = {"batching.read_batch_pages": 4}
    pipeline, faults, geo, buf, original, keys = faulty_pool(build, overrides)
    faults.rule = multi_page_cut(cut)
    scramble(buf, np.random.default_rng(10))
    before = copy_buffer(buf)
    ready: list[int] = []
    dst = list(range(20, 30))
    assert pipeline.get(keys, token_indices(dst, P), on_ready=ready.append) == [True] * 10
    assert same_bytes(
        buf, after_restore(before, original, geo, list(zip(range(10), dst, strict=True)))
    )
    assert ready == [4, 8, 10]
    assert pipeline.stats().fallbacks == {"TransportError": 10}  # batches of 4, 4 and 2 pages

    # A set through the same faults: retried page by page, every key stored intact.
    stored = copy_buffer(buf)
    assert pipeline.set(keys_of("n", 6), token_indices(range(10, 16), P)) == [True] * 6
    faults.rule = None
    scramble(buf, np.random.default_rng(11))
    before = copy_buffer(buf)
    assert pipeline.get(keys_of("n", 6), token_indices(range(0, 6), P)) == [True] * 6
    assert same_bytes(buf, after_restore(before, stored, geo, [(10 + i, i) for i in range(6)]))
    assert pipeline.stats().fallbacks == {"TransportError": 16}
    assert store_stats(pipeline)["claimed"] == store_stats(pipeline)["reserved"] == 0


def test_sparse_fallback_reports_exactly_the_pages_that_arrived(build: Build) -> None:
    overrides = {"batching.read_batch_pages": 4}
    pipeline, faults, geo, buf, original, keys = faulty_pool(build, overrides)
    dst = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29]
    broken = dst[5]  # a pool page that never takes a byte
    faults.rule = lambda batch, pages: 0 if broken in pages else None
    scramble(buf, np.random.default_rng(12))
    before = copy_buffer(buf)
    result = pipeline.get(keys, token_indices(dst, P))
    assert result[:5] == [True] * 5 and result[5] is False
    for i, page in enumerate(dst):
        arrived = page_bytes(buf, geo, page) == page_bytes(original, geo, i)
        assert result[i] == arrived, f"page {i}: reported {result[i]}, arrived {arrived}"
        if not arrived:
            assert page_bytes(buf, geo, page) == page_bytes(before, geo, page)
    assert pipeline.stats().fallbacks == {"TransportError": 4}
    assert store_stats(pipeline)["claimed"] == 0


def test_get_issues_no_batch_after_the_first_miss(build: Build) -> None:
    overrides = {"batching.read_batch_pages": 2, "batching.window_batches": 1}
    pipeline, faults, geo, buf, original, keys = faulty_pool(build, overrides, n=8)
    dst = list(range(20, 28))
    faults.rule = lambda batch, pages: 0 if dst[3] in pages else None
    scramble(buf, np.random.default_rng(13))
    before = copy_buffer(buf)
    faults.seen.clear()
    ready: list[int] = []
    result = pipeline.get(keys, token_indices(dst, P), on_ready=ready.append)
    assert result == [True, True, True] + [False] * 5
    assert ready == [2]
    issued = set().union(*faults.seen)
    assert issued.isdisjoint(dst[4:]), f"pages after the miss were issued: {issued & set(dst)}"
    assert same_bytes(buf, after_restore(before, original, geo, [(i, dst[i]) for i in range(3)]))


def test_a_set_with_a_broken_page_stores_every_other_key(build: Build) -> None:
    overrides = {"batching.read_batch_pages": 4}
    pipeline, faults, *_ = faulty_pool(build, overrides, n=1)
    faults.rule = lambda batch, pages: 0 if 13 in pages else None
    keys = keys_of("w", 8)
    result = pipeline.set(keys, token_indices(range(10, 18), P))
    assert result == [True, True, True, False, True, True, True, True]
    assert pipeline.exists(keys) == 3
    assert [pipeline.exists([key]) for key in keys] == [1, 1, 1, 0, 1, 1, 1, 1]
    stats = store_stats(pipeline)
    assert (stats["keys"], stats["reserved"]) == (8, 0)  # k0 and the seven written


def test_a_set_publishes_each_batch_once_it_landed(build: Build) -> None:
    """A batch's keys are present while later batches still copy (the store's commit after the
    last copy has that batch alone left); a batch that failed is the fallback's, and published
    with the rest at the end."""
    overrides = {"batching.read_batch_pages": 4, "batching.window_batches": 1}
    pipeline, faults, *_ = faulty_pool(build, overrides, n=1)
    keys = keys_of("w", 10)
    present: list[int] = []

    def rule(batch: CopyBatch, pages: set[int]) -> int | None:
        present.append(pipeline.exists(keys))
        return 0 if 15 in pages and len(pages) > 1 else None  # the second batch fails whole

    faults.rule = rule
    assert pipeline.set(keys, token_indices(range(10, 20), P)) == [True] * 10
    # Batches of pages 10-13, 14-17 (failed, then page by page), 18-19.
    assert present == [0, 4, 4, 4, 4, 4, 4]
    assert pipeline.exists(keys) == 10
    assert store_stats(pipeline)["reserved"] == 0


class EndsTransport(MemoryTransport):
    """A memory transport that asks for a write's first and last two pages (of 768 bytes) as
    batches of their own, as the cuda transport asks for two staging buffers' worth."""

    def end_bytes(self) -> int | None:
        return 2 * 768


def test_a_write_sends_its_first_and_last_pages_as_batches_of_their_own(build: Build) -> None:
    """The mover cuts a write's ends off its batches where its transport asks (the first
    copies start once they are prepared; only the last ones are published after the last
    copy); every page stored, its keys published as its batch landed; reads keep the
    strategy's batches."""
    faults = Faults()
    faults.geo = geometry(pages=32)
    overrides = {"batching.read_batch_pages": 8, "batching.window_batches": 1}
    pipeline, geo, buf, original, _ = stored_pool(
        build, "throughput", overrides, n=2, transport=EndsTransport(fault=faults)
    )
    assert geo.page_bytes == 768
    faults.buffer = buf
    present: list[int] = []
    written = keys_of("w", 10)

    def rule(batch: CopyBatch, pages: set[int]) -> None:
        present.append(pipeline.exists(written))

    faults.rule = rule
    faults.seen.clear()
    assert pipeline.set(written, token_indices(range(10, 20), P)) == [True] * 10
    assert [sorted(pages) for pages in faults.seen] == [[10, 11], list(range(12, 18)), [18, 19]]
    assert present == [0, 2, 8]  # each batch's keys published once it landed
    assert pipeline.exists(written) == 10
    scramble(buf, np.random.default_rng(4))
    before = copy_buffer(buf)
    faults.seen.clear()
    assert pipeline.get(written, token_indices(range(20, 30), P)) == [True] * 10
    assert [len(pages) for pages in faults.seen] == [10]  # read_batch_bytes joins them
    moved = [(10 + i, 20 + i) for i in range(10)]
    assert same_bytes(buf, after_restore(before, original, geo, moved))


@pytest.mark.parametrize("profile", ["default", "throughput"])
def test_miss_fallback_turns_a_failed_batch_into_misses(build: Build, profile: str) -> None:
    overrides = {
        "fallback.strategy": "miss",
        "batching.read_batch_pages": 4,
        "batching.read_batch_bytes": None,  # batches of 4 pages, not joined
    }
    faults = Faults()
    faults.geo = geometry(pages=32)
    pipeline, _, buf, _, keys = stored_pool(
        build, profile, overrides, n=8, transport=MemoryTransport(fault=faults)
    )
    faults.buffer = buf
    faults.rule = lambda batch, pages: 1 if 21 in pages else None
    result = pipeline.get(keys, token_indices(range(16, 24), P))
    assert result == [True] * 4 + [False] * 4
    assert pipeline.stats().fallbacks == {"TransportError": 4}
    assert pipeline.exists(keys) == 8, "a failed read does not lose stored keys"

    faults.rule = lambda batch, pages: 0
    assert pipeline.set(keys_of("m", 5), token_indices(range(8, 13), P)) == [False] * 5
    assert pipeline.exists(keys_of("m", 5)) == 0
    stats = store_stats(pipeline)
    assert (stats["keys"], stats["reserved"], stats["claimed"]) == (8, 0, 0)


def test_sparse_fallback_without_retries_counts_nothing_as_arrived(build: Build) -> None:
    overrides = {"fallback.max_retries": 0, "batching.read_batch_pages": 4}
    pipeline, faults, *_, keys = faulty_pool(build, overrides, n=4)
    faults.rule = multi_page_cut(2)
    assert pipeline.get(keys, token_indices(range(20, 24), P)) == [False] * 4


def test_fallbacks_are_counted_by_reason(build: Build) -> None:
    overrides = {"batching.read_batch_pages": 4}
    pipeline, faults, *_, keys = faulty_pool(build, overrides, n=8)

    def rule(batch: CopyBatch, pages: set[int]) -> int | None:
        if len(pages) == 1:
            return None
        if 20 in pages:
            raise RuntimeError("injected")
        return 0

    faults.rule = rule
    assert pipeline.get(keys, token_indices(range(20, 28), P)) == [True] * 8
    assert pipeline.stats().fallbacks == {"RuntimeError": 4, "TransportError": 4}


def test_a_transport_refusing_at_submit_fails_only_that_batch(build: Build) -> None:
    class Refusing(MemoryTransport):
        def submit(self, batch: CopyBatch) -> Any:
            if len(batch.descriptors) > 6:
                raise OSError("no room on the queue")
            return super().submit(batch)

    geo = geometry(pages=32)
    rng = np.random.default_rng(14)
    buf = random_buffer(geo, rng, "numpy-float16")
    original = copy_buffer(buf)
    pipeline = build(overrides={"batching.read_batch_pages": 4}, transport=Refusing())
    pipeline.register_pool("kv", geo, buf)
    assert pipeline.set(keys_of("k", 6), token_indices(range(6), P)) == [True] * 6
    scramble(buf, rng)
    before = copy_buffer(buf)
    assert pipeline.get(keys_of("k", 6), token_indices(range(10, 16), P)) == [True] * 6
    assert same_bytes(buf, after_restore(before, original, geo, [(i, 10 + i) for i in range(6)]))
    assert pipeline.stats().fallbacks == {"OSError": 12}


def test_get_raising_from_on_ready_waits_for_its_batches(build: Build) -> None:
    geo = geometry(pages=32)
    transport = TrackingTransport({25}, geo)
    overrides = {"batching.read_batch_pages": 2}
    pipeline, _, buf, _, keys = stored_pool(build, overrides=overrides, n=8, transport=transport)
    transport.buffer = buf
    copies_before = transport.finished

    def on_ready(count: int) -> None:
        raise RuntimeError("the engine's callback failed")

    timer = threading.Timer(0.5, transport.gate.set)
    timer.start()
    try:
        with pytest.raises(RuntimeError, match="callback failed"):
            pipeline.get(keys, token_indices(range(20, 28), P), on_ready=on_ready)
        # Batches of pages (20,21) ... (26,27): all four must be over when get returns.
        assert transport.finished - copies_before == 4
        assert store_stats(pipeline)["claimed"] == 0
    finally:
        timer.cancel()
        transport.gate.set()
