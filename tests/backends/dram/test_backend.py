"""The dram backend with a transport that asks for whole tier slots (``whole_slots``), the
layout the cuda transport's staging ring uses. The cuda transport needs a GPU, so here a
memory transport asks for it: the same backend data path, with numpy copies instead of CUDA
ones."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from kvcr_policy.backends.dram.transports.base import CopyBatch
from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.errors import IndicesError, UsageError
from kvcr_policy.geometry import PoolGeometry
from tests.support.pipelines import (
    LAYOUT_CASES,
    LAYOUT_IDS,
    Build,
    build,
    geometry,
    keep_switch_interval,
)
from tests.support.pools import P, keys_of, pages_of, random_buffer, token_indices

__all__ = ["build", "keep_switch_interval"]  # fixtures


class WholeSlots(MemoryTransport):
    """The memory transport, asking the backend for whole slots; keeps every batch."""

    whole_slots = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[CopyBatch] = []

    def copy(self, batch: CopyBatch) -> None:
        self.seen.append(batch)
        super().copy(batch)


@pytest.mark.parametrize(("layout", "mla"), LAYOUT_CASES, ids=LAYOUT_IDS)
def test_whole_slot_tier_round_trips_scattered_pages(build: Build, layout: str, mla: bool) -> None:
    geo = geometry(layout, mla=mla)
    buffer = random_buffer(geo, np.random.default_rng(7), "numpy-float16")
    transport = WholeSlots()
    pipeline = build("throughput", {"batching.read_batch_pages": 4}, transport=transport)
    pipeline.register_pool("kv", geo, buffer)
    stored, restored = [5, 3, 12, 9, 15, 0, 7], [1, 2, 4, 6, 8, 10, 11]
    keys = keys_of("k", len(stored))
    assert pipeline.set(keys, token_indices(stored, P)) == [True] * len(stored)
    # Each page went into one slot whole: its bytes one contiguous run of the tier.
    for batch in transport.seen:
        d = batch.descriptors
        for page in np.unique(d.page):
            mine = d.page == page
            start, end = d.dst[mine].min(), (d.dst[mine] + d.length[mine]).max()
            assert start % geo.page_bytes == 0
            assert end - start == d.length[mine].sum() == geo.page_bytes
    view = pages_of(buffer, geo)
    expected = view[:, stored].copy()
    view[:, restored] = 0
    assert pipeline.get(keys, token_indices(restored, P)) == [True] * len(restored)
    assert np.array_equal(view[:, restored], expected)
    assert np.array_equal(view[:, stored], expected)  # the stored pages were only read


class ReadsAhead(WholeSlots):
    """Whole slots, and a transport that reads ahead: records each read-ahead, the tickets
    batches carry, and what is forgotten, with the claim at each of those moments."""

    def __init__(self, pipeline: list[Any]) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.events: list[tuple[str, object, int]] = []

    def _claims(self) -> int:
        return int(self.pipeline[0].backend._pools[0].store.stats().claimed)

    def read_ahead(self, tier: Any, pool: Any, starts: Any, page_bytes: int,
                   fragments: int) -> object:  # fmt: skip
        ticket = object()
        self.starts, self.page_bytes, self.fragments = starts.copy(), page_bytes, fragments
        self.events.append(("read_ahead", ticket, self._claims()))
        return ticket

    def copy(self, batch: CopyBatch) -> None:
        self.events.append(("batch", batch.ticket, -1))
        super().copy(batch)

    def forget(self, ticket: object) -> None:
        self.events.append(("forget", ticket, self._claims()))


def reading_ahead(
    build: Build, seed: int, count: int
) -> tuple[Any, ReadsAhead, np.ndarray, PoolGeometry, list[str]]:
    """A pipeline over a transport that reads ahead (batches of 3 pages), with ``count`` keys
    stored from its first pages: pipeline, transport, pool buffer, geometry, keys."""
    geo = geometry("layer_first")
    buffer = random_buffer(geo, np.random.default_rng(seed), "numpy-float16")
    holder: list[Any] = []
    transport = ReadsAhead(holder)
    batches = {"batching.read_batch_pages": 3, "batching.read_batch_bytes": None}  # not joined
    pipeline = build("throughput", batches, transport=transport)
    holder.append(pipeline)
    pipeline.register_pool("kv", geo, buffer)
    keys = keys_of("k", count)
    assert pipeline.set(keys, token_indices(range(count), P)) == [True] * count
    return pipeline, transport, buffer, geo, keys


@pytest.mark.parametrize("fails", [False, True])
def test_a_read_reads_ahead_before_its_claim_and_uses_it_only_under_it(
    build: Build, fails: bool
) -> None:
    """The read-ahead starts before the call is validated and claimed (nothing claimed yet),
    from the first batch's slots in order; the claim finds them unchanged and adopts it, so
    every batch of the read carries its ticket; it is forgotten before the claim ends, on
    success and when a batch fails (then each page is retried). Writes read nothing ahead."""
    pipeline, transport, _, geo, keys = reading_ahead(build, 3, 7)
    assert [t for _, t, _ in transport.events] == [None] * 3  # a write reads nothing ahead
    transport.events.clear()
    slots = pipeline.backend._pools[0].store.lookup(keys)
    if fails:
        original, calls = transport.copy, itertools.count()

        def fail_first(batch: CopyBatch) -> None:
            if next(calls) == 0:
                raise OSError("injected: the first batch to run fails")
            original(batch)

        transport.copy = fail_first  # type: ignore[method-assign]
    assert pipeline.get(keys, token_indices(range(8, 15), P)) == [True] * 7
    kinds = [kind for kind, _, _ in transport.events]
    # Failing, one of three batches is retried page by page: two batches, 3 retries.
    assert kinds.count("batch") == (5 if fails else 3)
    assert kinds[0] == "read_ahead" and kinds.count("read_ahead") == 1
    ticket = transport.events[0][1]
    assert all(t is ticket for _, t, _ in transport.events)
    assert transport.events[0][2] == 0  # started before the claim
    # The transfer forgets it while its claim holds (the pipeline's cancel after is a no-op).
    forgets = [claimed for kind, _, claimed in transport.events if kind == "forget"]
    assert forgets[0] == 7 and kinds.index("forget") > max(
        i for i, kind in enumerate(kinds) if kind == "batch"
    )
    # At most the first batch's pages: a later batch never adopts a fill.
    assert np.array_equal(transport.starts, slots[:3] * geo.page_bytes)
    assert (transport.page_bytes, transport.fragments) == (geo.page_bytes,
                                                           geo.fragments_per_page)  # fmt: skip
    assert transport._claims() == 0


def test_a_refused_read_forgets_what_it_read_early_and_counts_nothing(build: Build) -> None:
    """Indices refused after the read-ahead started: it is forgotten, no batch runs, and the
    store counts no hit or miss and holds no claim (the read-ahead only looked the keys up)."""
    pipeline, transport, _, _, keys = reading_ahead(build, 4, 5)
    transport.events.clear()
    store = pipeline.backend._pools[0].store
    before = store.stats()
    with pytest.raises(IndicesError, match="4 pages"):
        pipeline.get(keys, token_indices(range(8, 12), P))  # indices of 4 pages for 5 keys
    kinds = [kind for kind, _, _ in transport.events]
    assert kinds == ["read_ahead", "forget"]
    assert transport.events[0][1] is transport.events[1][1]
    after = store.stats()
    assert (after.hits, after.misses, after.claimed) == (before.hits, before.misses, 0)


@pytest.mark.parametrize("bad", [7, ["a", "list"]], ids=["an int", "unhashable"])
def test_a_key_that_is_no_str_is_refused_after_a_read_ahead_and_nothing_is_kept(
    build: Build, bad: object
) -> None:
    """The read-ahead starts before the keys are checked: a key that is no str is found in no
    tier (an unhashable one cannot even be looked up), the call is refused naming it, what was
    read ahead of the keys before it is forgotten, and nothing is claimed or counted."""
    pipeline, transport, _, _, keys = reading_ahead(build, 4, 5)
    transport.events.clear()
    store = pipeline.backend._pools[0].store
    before = store.stats()
    with pytest.raises(UsageError, match="key at position 2 must be a str"):
        pipeline.get([*keys[:2], bad, *keys[3:]], token_indices(range(8, 13), P))
    kinds = [kind for kind, _, _ in transport.events]
    assert kinds == (["read_ahead", "forget"] if bad == 7 else [])
    after = store.stats()
    assert (after.hits, after.misses, after.claimed) == (before.hits, before.misses, 0)


def test_a_tier_whose_early_read_cannot_look_a_key_up_still_gets_the_key_refused(
    build: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A third party's early read that raises TypeError on a key it cannot look up starts
    nothing: the caller hears of the key, not of the tier."""
    pipeline, _, _, _, keys = reading_ahead(build, 4, 5)
    tier = pipeline.backend._pools[0]

    def cannot(keys: list[str]) -> None:
        raise TypeError("unhashable type: 'list'")

    monkeypatch.setattr(tier, "read_early", cannot)
    with pytest.raises(UsageError, match="key at position 0 must be a str"):
        pipeline.get([["a"], *keys[1:]], token_indices(range(8, 13), P))
    assert pipeline.get(keys, token_indices(range(8, 13), P)) == [True] * 5


def test_a_read_ahead_of_slots_rewritten_before_the_claim_is_never_used(build: Build) -> None:
    """Between the read-ahead and the claim, another call rewrites the first key (delete, then
    set new bytes): the claim finds its slot with a new generation, forgets the read-ahead and
    reads ahead anew under the claim; the batches carry only the new ticket and the page
    restored is the new one."""
    pipeline, transport, buffer, geo, keys = reading_ahead(build, 6, 4)
    view = pages_of(buffer, geo)
    rewritten = view[:, 14].copy()
    assert not np.array_equal(rewritten, view[:, 0])
    expected = view[:, :4].copy()
    expected[:, 0] = rewritten
    early = transport.read_ahead

    def rewrite_first(*args: Any) -> object:
        ticket = early(*args)
        if len(transport.events) == 1:  # the read-ahead before the claim
            assert pipeline.delete(keys[:1]) == 1
            assert pipeline.set(keys[:1], token_indices([14], P)) == [True]
        return ticket

    transport.read_ahead = rewrite_first  # type: ignore[method-assign]
    transport.events.clear()
    assert pipeline.get(keys, token_indices(range(8, 12), P)) == [True] * 4
    assert np.array_equal(view[:, 8:12], expected)
    read = [(kind, t, claimed) for kind, t, claimed in transport.events if t is not None]
    first, second = read[0][1], read[2][1]
    assert [(kind, claimed) for kind, _, claimed in read[:3]] == [
        ("read_ahead", 0),
        ("forget", 4),
        ("read_ahead", 4),
    ]
    assert read[1][1] is first and second is not first
    assert all(t is second for kind, t, _ in read if kind == "batch")
    assert transport._claims() == 0


class Interrupted(BaseException):
    """Not an Exception: as a KeyboardInterrupt would arrive."""


@pytest.mark.parametrize("error", [OSError("injected: no ring"), Interrupted()])
def test_a_failed_read_ahead_costs_nothing_but_time(
    build: Build, error: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    """An error while reading ahead is logged and the batches move every page; an interrupt
    propagates, and the claim taken before it is released."""
    pipeline, transport, buffer, geo, keys = reading_ahead(build, 5, 5)

    def fail(*args: Any) -> object:
        raise error

    transport.read_ahead = fail  # type: ignore[method-assign]
    view = pages_of(buffer, geo)
    expected = view[:, :5].copy()
    if isinstance(error, Interrupted):
        with pytest.raises(Interrupted):
            pipeline.get(keys, token_indices(range(8, 13), P))
    else:
        assert pipeline.get(keys, token_indices(range(8, 13), P)) == [True] * 5
        assert np.array_equal(view[:, 8:13], expected)
        assert "reading ahead failed (injected: no ring)" in caplog.text
    assert transport._claims() == 0
    assert pipeline.exists(keys) == 5
