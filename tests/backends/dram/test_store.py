"""Tests of the DRAM store: allocation, eviction, reservations, claims, lifetime, threads."""

from __future__ import annotations

import itertools
import random
import sys
import threading
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvcr_policy.backends.dram.store import (
    EVICTION_POLICIES,
    Claim,
    FIFOPolicy,
    Reservation,
    SlotState,
    Store,
    StoreStats,
    _FreeExtents,  # the allocator's scan threshold is patched below
    count_extents,
)
from kvcr_policy.errors import CapacityError, ClosedError
from tests.support.pools import keys_of
from tests.support.stateful import count_sequence, machine_settings, same_bytes


def put(store: Store, keys: Sequence[str]) -> Reservation:
    """Reserve and commit every covered key as written successfully."""
    reservation = store.reserve(keys)
    store.commit(reservation, [True] * len(reservation.keys))
    return reservation


# ---- allocation in extents ------------------------------------------------------------------


def test_consecutive_keys_get_consecutive_slots() -> None:
    store = Store(16)
    reservation = put(store, keys_of("a", 8))
    assert reservation.slots.tolist() == list(range(8))
    assert count_extents(store.lookup(keys_of("a", 8))) == 1
    second = put(store, keys_of("b", 5))
    assert second.slots.tolist() == list(range(8, 13))
    assert store.stats().extents == 1


def test_after_churn_first_fit_still_finds_a_run() -> None:
    store = Store(32)
    for key in keys_of("k", 32):  # one key per write: the worst case for fragmentation
        put(store, [key])
    store.delete(keys_of("k", 32)[::2])  # 16 holes of one slot
    assert store.stats().extents == 16
    store.delete([f"k{i}" for i in range(11, 21, 2)])  # slots 10..20 merge into one run
    assert store.stats().extents == 11
    reservation = put(store, keys_of("n", 6))
    assert reservation.slots.tolist() == list(range(10, 16))
    assert count_extents(reservation.slots) == 1


def test_without_a_fitting_run_the_fewest_runs_largest_first_are_used() -> None:
    store = Store(20)
    put(store, keys_of("k", 20))
    # Free runs of 1 (slot 0), 3 (2..4), 2 (6..7) and 4 (9..12).
    store.delete(["k0", "k2", "k3", "k4", "k6", "k7", "k9", "k10", "k11", "k12"])
    assert store.stats().extents == 4
    reservation = store.reserve(keys_of("n", 6))
    # The run of 4 and two slots of the run of 3, handed out in slot order.
    assert reservation.slots.tolist() == [2, 3, 9, 10, 11, 12]
    assert count_extents(reservation.slots) == 2


def reference_take(runs: Sequence[tuple[int, int]], count: int) -> list[int]:
    """The allocation rule spelled out: first run that fits, else the largest runs first (lower
    start first among equal lengths), in slot order."""
    for start, length in runs:
        if length >= count:
            return list(range(start, start + count))
    chosen = []
    for start, length in sorted(runs, key=lambda run: -run[1]):
        size = min(length, count)
        chosen.append((start, size))
        count -= size
        if count == 0:
            break
    return [slot for start, size in sorted(chosen) for slot in range(start, start + size)]


@pytest.mark.parametrize("vector_scan_from", [0, 1_000_000], ids=["numpy-scan", "python-scan"])
@given(holes=st.lists(st.booleans(), min_size=200, max_size=200), data=st.data())
@settings(max_examples=60, deadline=None)
def test_allocation_follows_first_fit_then_largest_first(
    vector_scan_from: int, holes: list[bool], data: st.DataObject
) -> None:
    with patch.object(_FreeExtents, "_VECTOR_SCAN_FROM", vector_scan_from):
        store = Store(200)
        keys = keys_of("k", 200)
        for key in keys:
            put(store, [key])
        store.delete([key for key, hole in zip(keys, holes, strict=True) if hole])
        runs = store.snapshot().free_runs
        free = sum(holes)
        assert sum(length for _, length in runs) == free
        if not free:
            return
        count = data.draw(st.integers(1, free))
        reservation = store.reserve(keys_of("n", count))
        assert reservation.slots.tolist() == reference_take(runs, count)
        assert count_extents(reservation.slots) == count_extents(reference_take(runs, count))


def test_freed_runs_merge_back_into_one_extent() -> None:
    store = Store(10)
    for key in keys_of("k", 10):
        put(store, [key])
    store.delete(["k1", "k3", "k5", "k7", "k9"])
    assert store.stats().extents == 5
    store.clear()
    assert store.stats().extents == 1
    assert store.snapshot().free_runs == ((0, 10),)


def test_count_extents() -> None:
    assert count_extents(np.array([], dtype=np.int64)) == 0
    assert count_extents([3, 4, 5]) == 1
    assert count_extents([3, 4, 6, 7, 1]) == 3
    assert count_extents([5, 4]) == 2  # descending slots need two copies
    assert count_extents([0, -1, 1, 2, -1]) == 2
    assert count_extents([-1, -1]) == 0


# ---- reservations ---------------------------------------------------------------------------


def test_present_keys_are_reported_and_get_no_slot() -> None:
    store = Store(8)
    put(store, ["a"])
    reservation = store.reserve(["a", "b"])
    assert reservation.present == (True, False)
    assert reservation.slots[0] == -1 and reservation.slots[1] >= 0
    assert reservation.generations[0] == -1


def test_keys_being_written_elsewhere_or_repeated_are_pending() -> None:
    store = Store(8)
    first = store.reserve(["a", "b"])
    second = store.reserve(["b", "c", "c"])
    assert second.pending == (True, False, True)
    assert second.slots[0] == -1 and second.slots[2] == -1
    assert store.contains_prefix(["a"]) == 0  # reserved keys are invisible to lookups
    store.commit(first, [True, True])
    store.commit(second, [True, True, True])
    assert store.contains_prefix(["a", "b", "c"]) == 3


def test_commit_publishes_only_the_keys_written() -> None:
    store = Store(8)
    reservation = store.reserve(["a", "b", "c"])
    assert store.stats().reserved == 3
    assert store.commit(reservation, np.array([True, False, True])) == 2
    assert store.lookup(["a", "b", "c"]).tolist() == [0, -1, 2]
    stats = store.stats()
    assert (stats.reserved, stats.used, stats.free, stats.keys) == (0, 2, 6, 2)
    assert put(store, ["d"]).slots.tolist() == [1]  # b's slot went back to the free runs


def test_publish_makes_keys_present_before_the_commit_which_does_the_rest() -> None:
    store = Store(8)
    reservation = store.reserve(["a", "b", "c"])
    assert store.publish(reservation, np.array([2, 0])) == 2  # a batch that landed
    assert store.lookup(["a", "b", "c"]).tolist() == [0, -1, 2]
    assert store.stats().reserved == 1
    assert store.publish(reservation, [0]) == 0  # published once
    assert store.commit(reservation, np.array([True, False, True])) == 0  # b's copy failed
    assert store.lookup(["a", "b", "c"]).tolist() == [0, -1, 2]
    stats = store.stats()
    assert (stats.reserved, stats.used, stats.keys) == (0, 2, 2)
    assert store.publish(reservation, [1]) == 0  # settled: nothing more


def test_an_abort_keeps_what_was_published_and_frees_the_rest() -> None:
    store = Store(4)
    reservation = store.reserve(["a", "b"])
    store.publish(reservation, [1])
    store.abort(reservation)
    assert store.lookup(["a", "b"]).tolist() == [-1, 1]
    assert store.stats().reserved == 0


def test_a_write_of_present_keys_publishes_only_when_it_commits() -> None:
    store = Store(4)
    put(store, ["a"])
    reservation = store.reserve(["b", "a"])
    assert store.publish(reservation, [0]) == 0  # its admits and touches keep their order
    assert store.contains_prefix(["b"]) == 0
    assert store.commit(reservation, [True, True]) == 1


def test_a_key_deleted_while_writing_is_not_published_early() -> None:
    store = Store(4)
    reservation = store.reserve(["a", "b"])
    store.delete(["a"])
    assert store.publish(reservation, [0, 1]) == 1
    assert store.lookup(["a", "b"]).tolist() == [-1, 1]
    assert store.commit(reservation, [True, True]) == 0
    assert store.stats().reserved == 0


def test_abort_frees_everything_and_a_late_commit_does_nothing() -> None:
    store = Store(1)
    stale = store.reserve(["a"])
    store.abort(stale)
    fresh = store.reserve(["b"])
    assert fresh.slots.tolist() == stale.slots.tolist()
    assert fresh.generations[0] > stale.generations[0]
    assert store.commit(stale, [True]) == 0  # must not publish "a" into b's slot
    assert store.lookup(["a", "b"]).tolist() == [-1, -1]
    assert store.commit(fresh, [True]) == 1
    assert store.commit(fresh, [True]) == 0  # settling twice is harmless
    store.abort(fresh)
    assert store.lookup(["b"]).tolist() == [0]


def test_a_reservation_of_another_store_is_ignored() -> None:
    one, two = Store(4), Store(4)
    reservation = one.reserve(["a"])
    assert two.commit(reservation, [True]) == 0
    assert two.stats().keys == 0


def test_commit_needs_one_flag_per_covered_key() -> None:
    store = Store(4)
    reservation = store.reserve(["a", "b"])
    with pytest.raises(ValueError, match="2 keys"):
        store.commit(reservation, [True])
    assert store.commit(reservation, [True, True]) == 2  # still open after the refusal


def test_delete_while_writing_cancels_the_write() -> None:
    store = Store(2)
    reservation = store.reserve(["a"])
    store.delete(["a"])
    # The slot stays held while the writer may still copy into it.
    assert store.stats().reserved == 1
    again = store.reserve(["a"])
    assert again.slots.tolist() != reservation.slots.tolist()
    assert store.commit(reservation, [True]) == 0
    assert store.commit(again, [True]) == 1
    assert store.lookup(["a"]).tolist() == again.slots.tolist()
    assert store.stats().reserved == 0


def test_capacity_shortfall_covers_a_leading_run() -> None:
    store = Store(3)
    put(store, ["x"])
    claim = store.claim(["x"])
    reservation = store.reserve(["x", "a", "b", "c"])
    assert reservation.keys == ("x", "a", "b")
    assert not reservation.complete and reservation.requested == 4
    store.commit(reservation, [True] * 3)
    assert store.contains_prefix(["x", "a", "b", "c"]) == 3
    store.release(claim)


def test_capacity_error_when_nothing_fits() -> None:
    store = Store(2)
    put(store, ["a", "b"])
    claim = store.claim(["a", "b"])
    with pytest.raises(CapacityError, match=r"pool 'kv'.*'c'"):
        store.reserve(["c"])
    assert store.reserve(["a"]).present == (True,)  # no slot needed: no error
    assert store.reserve([]).keys == ()
    store.release(claim)
    assert store.reserve(["c"]).complete


# ---- eviction -------------------------------------------------------------------------------


def test_lru_evicts_the_least_recently_used() -> None:
    store = Store(3)
    for key in "abc":
        put(store, [key])
    store.release(store.claim(["a"]))  # a get
    put(store, ["b"])  # a set of a present key counts as a use too, when it commits
    put(store, ["d"])
    assert store.contains_prefix(["c"]) == 0
    assert store.lookup(["a", "b", "d"]).min() >= 0
    assert store.stats().evictions == 1


def test_a_commit_uses_its_keys_in_their_order() -> None:
    store = Store(3)
    put(store, ["a"])
    put(store, ["b"])
    put(store, ["x", "a"])  # x is admitted, then a is touched: least recent first b, x, a
    put(store, ["y", "z"])  # two victims
    assert store.contains_prefix(["a"]) == 1
    assert store.lookup(["b", "x"]).tolist() == [-1, -1]
    reservation = store.reserve(["a"])
    store.abort(reservation)  # an aborted set of a present key is no use
    put(store, ["w"])
    assert store.contains_prefix(["a"]) == 0


def test_fifo_evicts_the_first_published() -> None:
    store = Store(3, eviction="fifo")
    for key in "abc":
        put(store, [key])
    store.release(store.claim(["a"]))
    put(store, ["d"])
    assert store.lookup(["a", "b", "c", "d"]).tolist()[0] == -1


def test_lookups_do_not_count_as_uses() -> None:
    store = Store(2)
    put(store, ["a"])
    put(store, ["b"])
    store.contains_prefix(["a"])
    store.lookup(["a"])
    put(store, ["c"])
    assert store.contains_prefix(["a"]) == 0


def test_unknown_policy_lists_the_names() -> None:
    with pytest.raises(ValueError, match=r"'mru'.*fifo, lru"):
        Store(4, eviction="mru")
    assert {"lru", "fifo"} <= set(EVICTION_POLICIES)
    store = Store(2, eviction=FIFOPolicy())  # or an instance, owned by this store alone
    put(store, ["a"])
    put(store, ["b"])
    store.release(store.claim(["a"]))
    put(store, ["c"])
    assert store.contains_prefix(["a"]) == 0


def test_claimed_slots_are_never_evicted_even_when_full() -> None:
    store = Store(2)
    put(store, ["a", "b"])
    claim = store.claim(["a"])
    reservation = store.reserve(["c", "d"])  # only b may go
    assert reservation.keys == ("c",)
    store.commit(reservation, [True])
    assert store.lookup(["a"]).tolist() == claim.slots.tolist()
    store.claim(["c"])
    with pytest.raises(CapacityError):
        store.reserve(["e"])
    assert store.evict(5) == 0


def test_explicit_evict() -> None:
    store = Store(4)
    for key in "abcd":
        put(store, [key])
    claim = store.claim(["a"])
    assert store.evict(2) == 2  # a is claimed: b and c go
    assert store.lookup(list("abcd")).tolist() == [0, -1, -1, 3]
    store.release(claim)
    assert store.evict(10) == 2
    assert store.stats().evictions == 4


def test_a_request_never_evicts_its_own_present_keys() -> None:
    store = Store(2)
    put(store, ["a"])
    put(store, ["b"])
    reservation = store.reserve(["a", "c", "d"])  # a is least recent but present here
    assert reservation.keys == ("a", "c")
    assert store.contains_prefix(["a"]) == 1


# ---- claims ---------------------------------------------------------------------------------


def test_a_write_in_flight_keeps_its_present_keys_until_it_settles() -> None:
    # A set cut into batches reserves each on its own: a later batch must not evict the key an
    # earlier one found present (and reported stored) before that batch commits.
    store = Store(2)
    put(store, ["a"])
    put(store, ["b"])
    first = store.reserve(["a"])  # a is present: no copy, a success once committed
    assert first.held == (store.lookup(["a"]).item(),)
    later = store.reserve(["c"])  # a is least recently used, but held: b goes
    assert store.lookup(["a", "b"]).tolist()[1] == -1
    store.commit(later, [True])
    store.commit(first, [True])
    assert store.contains_prefix(["a", "c"]) == 2
    put(store, ["d"])  # both settled: c was admitted before a was touched, so c goes
    assert store.lookup(["a", "c"]).tolist()[1] == -1
    assert store.stats().evictions == 2


def test_claim_covers_the_leading_present_run() -> None:
    store = Store(8)
    put(store, ["a", "b", "d"])
    claim = store.claim(["a", "b", "c", "d"])
    assert claim.keys == ("a", "b")
    assert claim.slots.tolist() == [0, 1]
    stats = store.stats()
    assert (stats.claimed, stats.hits, stats.misses) == (2, 2, 2)
    with pytest.raises(ValueError):
        claim.slots[0] = 5  # claims are values: their arrays are read-only
    store.release(claim)
    store.release(claim)  # idempotent
    assert store.stats().claimed == 0


def test_delete_of_a_claimed_key_frees_its_slot_at_the_last_release() -> None:
    store = Store(1)
    put(store, ["a"])
    first, second = store.claim(["a"]), store.claim(["a"])
    assert store.delete(["a"]) == 1
    assert store.contains_prefix(["a"]) == 0
    assert store.snapshot().states.tolist() == [SlotState.ORPHANED]
    with pytest.raises(CapacityError):
        store.reserve(["b"])  # the slot may still be being read
    store.release(first)
    with pytest.raises(CapacityError):
        store.reserve(["b"])
    store.release(second)
    assert store.reserve(["b"]).slots.tolist() == [0]


def test_clear_respects_claims() -> None:
    store = Store(4)
    put(store, ["a", "b", "c"])
    claim = store.claim(["b"])
    assert store.clear() == 3
    stats = store.stats()
    assert (stats.keys, stats.used, stats.claimed, stats.free) == (0, 1, 1, 3)
    store.release(claim)
    assert store.stats().free == 4


def test_stale_release_never_touches_a_newer_occupant() -> None:
    store = Store(1)
    put(store, ["a"])
    stale = store.claim(["a"])
    store.release(stale)
    store.delete(["a"])
    put(store, ["b"])  # same slot, new generation
    current = store.claim(["b"])
    assert current.slots.tolist() == stale.slots.tolist()
    assert current.generations[0] > stale.generations[0]
    store.release(stale)  # a late completion of the old read
    assert store.snapshot().claims.tolist() == [1]
    assert store.evict(1) == 0
    # Even a claim that was never released here cannot act on another generation.
    forged = Claim(
        token=current.token,
        keys=("b",),
        slots=current.slots,
        generations=stale.generations,
        requested=1,
    )
    store.release(forged)
    assert store.snapshot().claims.tolist() == [1]
    store.release(current)  # the token was spent by the forged copy, so nothing more happens
    assert store.stats().claimed == 1


# ---- lookups, stats, lifetime ---------------------------------------------------------------


def test_lookups() -> None:
    store = Store(8)
    put(store, ["a", "b", "c"])
    assert store.contains_prefix(["a", "b", "x", "c"]) == 2
    assert store.contains_prefix([]) == 0
    slots = store.lookup(["c", "x", "a"])
    assert slots.dtype == np.int64
    assert slots.tolist() == [2, -1, 0]
    assert store.lookup([]).shape == (0,)


def test_stats_fields() -> None:
    store = Store(8)
    put(store, ["a", "b"])
    store.reserve(["c"])
    store.claim(["a", "z"])
    assert store.stats() == StoreStats(
        capacity=8,
        used=2,
        reserved=1,
        claimed=1,
        evictions=0,
        hits=1,
        misses=1,
        extents=1,
        free=5,
        keys=2,
    )


def test_capacity_is_validated() -> None:
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="capacity"):
            Store(bad)  # type: ignore[arg-type]  # wrong types on purpose


def test_every_call_after_close_raises() -> None:
    store = Store(4, pool="mamba")
    reservation = store.reserve(["a"])
    claim = store.claim(["a"])
    store.close()
    store.close()  # idempotent
    assert store.closed
    calls = {
        "reserve": lambda: store.reserve(["b"]),
        "commit": lambda: store.commit(reservation, [True]),
        "abort": lambda: store.abort(reservation),
        "contains_prefix": lambda: store.contains_prefix(["a"]),
        "lookup": lambda: store.lookup(["a"]),
        "claim": lambda: store.claim(["a"]),
        "release": lambda: store.release(claim),
        "delete": lambda: store.delete(["a"]),
        "clear": store.clear,
        "evict": lambda: store.evict(1),
        "stats": store.stats,
        "snapshot": store.snapshot,
    }
    for name, call in calls.items():
        with pytest.raises(ClosedError, match=rf"pool 'mamba' is closed: {name}\(\)"):
            call()


# ---- stateful model -------------------------------------------------------------------------

CAPACITY = 4
KEYS = keys_of("k", 7)
PAGE = 48  # bytes per slot of the tier the machine writes through the store's answers
key_lists = st.lists(st.sampled_from(KEYS), min_size=1, max_size=3)


def page_of(key: str, slot: int, generation: int) -> bytes:
    """The bytes a write of ``key`` into ``slot`` (occupant ``generation``) puts there."""
    seed = zlib.crc32(f"{key}@{slot}.{generation}".encode())
    return np.random.default_rng(seed).integers(0, 256, PAGE, dtype=np.uint8).tobytes()


class StoreMachine(RuleBasedStateMachine):
    """Drives a Store and a plain model side by side; the model predicts evictions exactly.

    It also moves bytes the way the pipeline does, through a tier of CAPACITY pages: a write
    fills every slot its reservation handed out at once (the copy runs before the commit), a
    failed or aborted write leaves garbage there, and every page a claim or a lookup reports
    present must hold exactly the bytes written for that key and occupant.
    """

    policy = "lru"

    def __init__(self) -> None:
        super().__init__()
        count_sequence("store")
        self.store = Store(CAPACITY, eviction=self.policy)
        self.tier = bytearray(CAPACITY * PAGE)
        self.published: dict[str, tuple[int, int]] = {}  # key -> (slot, generation)
        self.order: list[str] = []  # eviction order of published keys, first victim first
        self.reserving: dict[str, int] = {}
        self.cancelled: set[int] = set()
        self.orphans: set[int] = set()
        self.claims: Counter[int] = Counter()
        self.pinned: Counter[int] = Counter()  # slots open reservations hold as present
        self.last_generation: dict[int, int] = {}
        self.open: dict[int, Reservation] = {}
        self.early: dict[int, set[int]] = {}  # positions of open reservations published early
        self.settled: list[Reservation] = []
        self.live: dict[int, Claim] = {}
        self.released: list[Claim] = []

    # model helpers
    def touch(self, key: str) -> None:
        if self.policy == "lru":
            self.order.remove(key)
            self.order.append(key)

    def unpublish(self, key: str) -> int:
        slot, _ = self.published.pop(key)
        self.order.remove(key)
        return slot

    def victims(self, count: int, protect: set[int]) -> list[str]:
        candidates = [
            key
            for key in self.order
            if self.claims[self.published[key][0]] == 0
            and self.pinned[self.published[key][0]] == 0
            and self.published[key][0] not in protect
        ]
        return candidates[: max(count, 0)]

    def held(self) -> set[int]:
        slots = {slot for slot, _ in self.published.values()}
        return slots | set(self.reserving.values()) | self.cancelled | self.orphans

    # model steps, each checked against the store
    def start_write(self, keys: list[str]) -> Reservation | None:
        present = [key in self.published for key in keys]
        pending, needed, asked = [False] * len(keys), [], set()
        for position, key in enumerate(keys):
            if present[position]:
                continue
            if key in self.reserving or key in asked:
                pending[position] = True
            else:
                asked.add(key)
                needed.append(position)
        free = CAPACITY - len(self.held())
        runs_before = self.store.snapshot().free_runs
        protect = {self.published[key][0] for key, hit in zip(keys, present, strict=True) if hit}
        evicted = self.victims(len(needed) - free, protect)
        got = min(len(needed), free + len(evicted))
        cover = needed[got] if got < len(needed) else len(keys)
        if cover == 0:
            with pytest.raises(CapacityError):
                self.store.reserve(keys)
            return None
        reservation = self.store.reserve(keys)
        for key in evicted:
            self.unpublish(key)
        assert reservation.keys == tuple(keys[:cover])
        assert reservation.present == tuple(present[:cover])
        assert reservation.pending == tuple(pending[:cover])
        kept = [
            self.published[key][0]
            for key, hit in zip(keys[:cover], present[:cover], strict=True)
            if hit
        ]
        assert list(reservation.held) == kept  # kept from eviction until it settles
        self.pinned.update(kept)
        held = self.held()
        given = reservation.slots[reservation.slots >= 0].tolist()
        assert len(given) == got == len(set(given))
        assert not held & set(given)
        fitting = [start for start, length in runs_before if length >= got]
        if got and not evicted and fitting:
            assert given == list(range(fitting[0], fitting[0] + got))  # first fit
        for position in needed[:got]:
            key = keys[position]
            slot = int(reservation.slots[position])
            generation = int(reservation.generations[position])
            assert generation > self.last_generation.get(slot, 0)
            self.last_generation[slot] = generation
            self.reserving[key] = slot
            self.tier[slot * PAGE : (slot + 1) * PAGE] = page_of(key, slot, generation)
        self.open[reservation.token] = reservation
        return reservation

    def settle(self, reservation: Reservation, ok: list[bool], commit: bool = True) -> int:
        """The reservation settles; a commit uses its keys in their order (a present key is
        touched if it still is, a written one admitted)."""
        published = 0
        self.pinned.subtract(reservation.held)
        early = self.early.pop(reservation.token, set())
        for position, (key, slot, generation, written, present) in enumerate(
            zip(
                reservation.keys,
                reservation.slots.tolist(),
                reservation.generations.tolist(),
                ok,
                reservation.present,
                strict=True,
            )
        ):
            if position in early:  # published already, and its copy was complete
                continue
            if slot < 0:
                if commit and present and key in self.published:
                    self.touch(key)
                continue
            if not written and self.reserving.get(key) == slot:
                # The copy died part-way: half of the slot holds something else.
                self.tier[slot * PAGE : slot * PAGE + PAGE // 2] = bytes(PAGE // 2)
            if slot in self.cancelled:
                self.cancelled.discard(slot)
            elif self.reserving.get(key) == slot:
                del self.reserving[key]
                if written:
                    self.published[key] = (slot, generation)
                    self.order.append(key)
                    published += 1
        self.settled.append(self.open.pop(reservation.token))
        return published

    def publish_early(self, reservation: Reservation, positions: list[int]) -> int:
        """Keys of an open write of new keys published before it settles (their copies are
        complete); a key deleted meanwhile is not."""
        if True in reservation.present:
            return 0
        done = self.early.setdefault(reservation.token, set())
        published = 0
        for position in positions:
            key = reservation.keys[position]
            slot = int(reservation.slots[position])
            if slot < 0 or position in done or self.reserving.get(key) != slot:
                continue
            del self.reserving[key]
            self.published[key] = (slot, int(reservation.generations[position]))
            self.order.append(key)
            done.add(position)
            published += 1
        return published

    def finish_write(self, reservation: Reservation, ok: list[bool]) -> None:
        expected = self.settle(reservation, ok)
        assert self.store.commit(reservation, ok) == expected

    def page(self, slot: int) -> bytes:
        return bytes(self.tier[slot * PAGE : (slot + 1) * PAGE])

    def start_read(self, keys: list[str]) -> Claim:
        claim = self.store.claim(keys)
        run = list(itertools.takewhile(self.published.__contains__, keys))
        assert claim.keys == tuple(run)
        assert claim.slots.tolist() == [self.published[key][0] for key in run]
        assert claim.generations.tolist() == [self.published[key][1] for key in run]
        for key, slot, generation in zip(
            claim.keys, claim.slots.tolist(), claim.generations.tolist(), strict=True
        ):
            same_bytes("store", self.page(slot), page_of(key, slot, generation), f"claimed {key}")
        for key in run:
            self.claims[self.published[key][0]] += 1
            self.touch(key)
        self.live[claim.token] = claim
        return claim

    def finish_read(self, claim: Claim) -> None:
        del self.live[claim.token]
        for slot in claim.slots.tolist():
            self.claims[slot] -= 1
            if self.claims[slot] == 0:
                self.orphans.discard(slot)
        self.store.release(claim)
        self.released.append(claim)

    # rules
    @rule(keys=key_lists)
    def reserve(self, keys: list[str]) -> None:
        self.start_write(keys)

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        reservation = self.open[data.draw(st.sampled_from(sorted(self.open)))]
        size = len(reservation.keys)
        self.finish_write(
            reservation, data.draw(st.lists(st.booleans(), min_size=size, max_size=size))
        )

    @rule(keys=key_lists)
    def put(self, keys: list[str]) -> None:
        """A whole set: reserve, then every copy succeeds."""
        reservation = self.start_write(keys)
        if reservation is not None:
            self.finish_write(reservation, [True] * len(reservation.keys))

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def publish(self, data: st.DataObject) -> None:
        """A batch of an open write landed: its keys are published before the write settles."""
        reservation = self.open[data.draw(st.sampled_from(sorted(self.open)))]
        size = len(reservation.keys)
        positions = data.draw(st.lists(st.integers(0, max(size - 1, 0)), unique=True))
        positions = positions if size else []
        expected = self.publish_early(reservation, positions)
        assert self.store.publish(reservation, positions) == expected

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        reservation = self.open[data.draw(st.sampled_from(sorted(self.open)))]
        self.settle(reservation, [False] * len(reservation.keys), commit=False)
        self.store.abort(reservation)

    @precondition(lambda self: self.settled)
    @rule(data=st.data(), commit=st.booleans())
    def settle_again(self, data: st.DataObject, commit: bool) -> None:
        reservation = data.draw(st.sampled_from(self.settled))
        if commit:
            assert self.store.commit(reservation, [True] * len(reservation.keys)) == 0
        else:
            self.store.abort(reservation)

    @rule(keys=key_lists)
    def claim(self, keys: list[str]) -> None:
        self.start_read(keys)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.finish_read(self.live[data.draw(st.sampled_from(sorted(self.live)))])

    @rule(keys=key_lists)
    def get(self, keys: list[str]) -> None:
        """A whole get: claim, copy, release."""
        self.finish_read(self.start_read(keys))

    @precondition(lambda self: self.released)
    @rule(data=st.data())
    def release_again(self, data: st.DataObject) -> None:
        self.store.release(data.draw(st.sampled_from(self.released)))

    def remove(self, keys: Sequence[str]) -> int:
        removed = 0
        for key in keys:
            if key in self.published:
                slot = self.unpublish(key)
                removed += 1
                if self.claims[slot]:
                    self.orphans.add(slot)
            elif key in self.reserving:
                self.cancelled.add(self.reserving.pop(key))
        return removed

    @rule(keys=key_lists)
    def delete(self, keys: list[str]) -> None:
        assert self.store.delete(keys) == self.remove(keys)

    @rule(count=st.integers(0, 4))
    def evict(self, count: int) -> None:
        victims = self.victims(count, set())
        for key in victims:
            self.unpublish(key)
        assert self.store.evict(count) == len(victims)

    @rule()
    def clear(self) -> None:
        expected = self.remove([*self.published, *self.reserving])
        assert self.store.clear() == expected

    # invariants
    @invariant()
    def tables_agree_with_the_model(self) -> None:
        snap = self.store.snapshot()
        assert dict(snap.published) == {key: slot for key, (slot, _) in self.published.items()}
        assert dict(snap.reserving) == self.reserving
        for slot, generation in self.published.values():
            assert snap.generations[slot] == generation  # the occupant that was published
        owned = [*snap.published.values(), *snap.reserving.values()]
        assert len(owned) == len(set(owned))  # no slot owned by two keys
        states = Counter(snap.states.tolist())
        assert states[SlotState.PUBLISHED] == len(self.published)
        assert states[SlotState.RESERVED] == len(self.reserving)
        assert states[SlotState.CANCELLED] == len(self.cancelled)
        assert states[SlotState.ORPHANED] == len(self.orphans)
        assert sum(states.values()) == CAPACITY
        assert snap.claims.tolist() == [self.claims[slot] for slot in range(CAPACITY)]

    @invariant()
    def present_pages_hold_their_bytes(self) -> None:
        """Every published slot, and every slot a live claim reads, holds its writer's bytes."""
        slots = self.store.lookup(KEYS).tolist()
        for key, slot in zip(KEYS, slots, strict=True):
            if slot >= 0:
                generation = int(self.store.snapshot().generations[slot])
                same_bytes("store", self.page(slot), page_of(key, slot, generation), key)
        for claim in self.live.values():
            for key, slot, generation in zip(
                claim.keys, claim.slots.tolist(), claim.generations.tolist(), strict=True
            ):
                want = page_of(key, slot, generation)
                same_bytes("store", self.page(slot), want, f"{key} while claimed")

    @invariant()
    def claimed_slots_keep_their_occupant(self) -> None:
        snap = self.store.snapshot()
        for claim in self.live.values():
            assert snap.generations[claim.slots].tolist() == claim.generations.tolist()
            assert set(snap.states[claim.slots].tolist()) <= {
                SlotState.PUBLISHED,
                SlotState.ORPHANED,
            }

    @invariant()
    def free_runs_are_the_maximal_runs_of_free_slots(self) -> None:
        snap = self.store.snapshot()
        free = np.flatnonzero(snap.states == SlotState.FREE)
        expanded = [
            slot for start, length in snap.free_runs for slot in range(start, start + length)
        ]
        assert expanded == free.tolist()
        assert len(snap.free_runs) == count_extents(free)
        stats = self.store.stats()
        assert stats.used + stats.reserved + stats.free == CAPACITY
        assert stats.extents == len(snap.free_runs)

    @invariant()
    def lookups_agree_with_the_model(self) -> None:
        expected = [self.published[key][0] if key in self.published else -1 for key in KEYS]
        assert self.store.lookup(KEYS).tolist() == expected
        prefix = 0
        while prefix < len(KEYS) and KEYS[prefix] in self.published:
            prefix += 1
        assert self.store.contains_prefix(KEYS) == prefix


class FIFOStoreMachine(StoreMachine):
    policy = "fifo"


TestStoreLRU = StoreMachine.TestCase
TestStoreLRU.settings = machine_settings(400, steps=40)
TestStoreFIFO = FIFOStoreMachine.TestCase
TestStoreFIFO.settings = machine_settings(400, steps=40)


def test_machine_on_the_vectorised_allocator_path() -> None:
    """The machine's tier is small, so its allocator scans in Python; rerun it vectorised."""
    with patch.object(_FreeExtents, "_VECTOR_SCAN_FROM", 0):
        run_state_machine_as_test(StoreMachine, settings=machine_settings(100, steps=40))


# ---- threads --------------------------------------------------------------------------------


def value_of(key: str) -> int:
    return zlib.crc32(key.encode())


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads every 10 µs instead of 5 ms, so the workers interleave inside calls."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@pytest.mark.usefixtures("fast_switching")
def test_four_threads_keep_the_store_consistent() -> None:
    capacity = 48
    store = Store(capacity)
    tier = np.zeros(capacity, dtype=np.int64)  # stands in for the pages the pipeline copies
    universe = keys_of("t", 160)
    errors: list[str] = []
    start = threading.Barrier(4)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        for _ in range(1500):
            first = rng.randrange(len(universe))
            keys = universe[first : first + rng.randint(1, 8)]
            action = rng.random()
            if action < 0.45:
                try:
                    reservation = store.reserve(keys)
                except CapacityError:
                    continue
                ok = []
                for key, slot in zip(reservation.keys, reservation.slots.tolist(), strict=True):
                    if slot >= 0:
                        tier[slot] = value_of(key)
                    ok.append(rng.random() < 0.9)
                if rng.random() < 0.1:
                    store.abort(reservation)
                else:
                    store.commit(reservation, ok)
            elif action < 0.9:
                claim = store.claim(keys)
                for _ in range(2):  # read twice: a claimed slot must not change under us
                    for key, slot in zip(claim.keys, claim.slots.tolist(), strict=True):
                        if tier[slot] != value_of(key):
                            errors.append(f"slot {slot} of claimed {key} was overwritten")
                store.release(claim)
            elif action < 0.97:
                store.delete(keys)
            else:
                store.evict(rng.randint(1, 4))

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    stats = store.stats()
    assert (stats.reserved, stats.claimed) == (0, 0)
    assert stats.used + stats.free == capacity
    snap = store.snapshot()
    assert len(set(snap.published.values())) == len(snap.published) == stats.keys
    for key, slot in snap.published.items():
        assert tier[slot] == value_of(key)
    free = np.flatnonzero(snap.states == SlotState.FREE)
    assert [s for start, n in snap.free_runs for s in range(start, start + n)] == free.tolist()
    assert stats.hits > 0 and stats.evictions > 0


def test_watchers_see_every_change_after_it_happened() -> None:
    """A watcher is called once per changing call, after it, outside the lock (it may read
    the stats), so the claims and bytes in use it reads are the new ones."""
    store = Store(4)
    seen: list[tuple[int, int]] = []
    store.watch(lambda: seen.append((store.stats().used, store.stats().claimed)))
    reservation = store.reserve(["a", "b"])
    assert seen == [(0, 0)]  # reserved, not yet in use
    store.commit(reservation, [True, True])
    claim = store.claim(["a", "b"])
    store.release(claim)
    store.abort(store.reserve(["c"]))
    store.delete(["a"])
    store.evict(1)
    store.clear()
    assert seen == [(0, 0), (2, 0), (2, 2), (2, 0), (2, 0), (2, 0), (1, 0), (0, 0), (0, 0)]
    store.contains_prefix(["a"])
    store.lookup(["a"])
    store.stats()
    assert len(seen) == 9  # reads change nothing and call no one
