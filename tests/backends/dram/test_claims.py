"""A claim of many keys at once (array operations) against claiming them one at a time."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given

from kvcr_policy.backends.dram.claims import ClaimCounts
from kvcr_policy.backends.dram.store import Claim, Store
from kvcr_policy.errors import CapacityError
from tests.strategies import ClaimScenario, claim_scenarios


def _put(store: Store, key: str) -> None:
    try:
        reservation = store.reserve([key])
    except CapacityError:  # every slot claimed or held: nothing to write into
        return
    store.commit(reservation, [True] * len(reservation.keys))


def _build(scenario: ClaimScenario) -> tuple[Store, list[Claim]]:
    store = Store(scenario.capacity, eviction=scenario.policy)
    for key in scenario.stored:
        _put(store, key)
    return store, [store.claim(keys) for keys in scenario.held]


def _observe(store: Store) -> tuple[Any, ...]:
    """Everything a claim or release changes, hits and misses aside (a claim of many keys
    counts the keys past its run as misses; claims of one key each never see those keys)."""
    snap, stats = store.snapshot(), store.stats()
    return (
        dict(snap.published),
        snap.states.tolist(),
        snap.generations.tolist(),
        snap.claims.tolist(),
        snap.free_runs,
        stats.claimed,
        stats.used,
        stats.free,
        stats.reserved,
    )


def _eviction_order(store: Store) -> list[list[str]]:
    """Published keys in the order the store evicts them (one eviction at a time)."""
    order = []
    before = set(store.snapshot().published)
    while store.evict(1):
        after = set(store.snapshot().published)
        order.append(sorted(before - after))
        before = after
    return order


@given(claim_scenarios())
def test_a_claim_of_many_keys_equals_claiming_them_one_at_a_time(scenario: ClaimScenario) -> None:
    batch, held_batch = _build(scenario)
    single, held_single = _build(scenario)
    assert _observe(batch) == _observe(single)

    claim = batch.claim(scenario.claimed)
    ones = [single.claim([key]) for key in claim.keys]
    assert all(len(one.keys) == 1 for one in ones)
    assert claim.slots.tolist() == [int(one.slots[0]) for one in ones]
    assert claim.generations.tolist() == [int(one.generations[0]) for one in ones]
    assert _observe(batch) == _observe(single)

    for store in (batch, single):  # orphan some claimed slots, reuse others
        store.delete(scenario.deleted)
        for key in scenario.rewritten:
            _put(store, key)
    assert _observe(batch) == _observe(single)

    batch.release(claim)
    for one in ones:
        single.release(one)
    assert _observe(batch) == _observe(single)
    batch.release(claim)  # idempotent
    assert _observe(batch) == _observe(single)

    for store, held in ((batch, held_batch), (single, held_single)):
        for earlier in held:
            store.release(earlier)
    assert _observe(batch) == _observe(single)
    assert batch.stats().claimed == single.stats().claimed == 0
    assert _eviction_order(batch) == _eviction_order(single)


@given(claim_scenarios())
def test_claim_counts_match_a_count_per_slot(scenario: ClaimScenario) -> None:
    """ClaimCounts.add/remove give what +1/-1 per entry, never below zero, would."""
    capacity = scenario.capacity
    slots = np.array([int(key[1:]) % capacity for key in scenario.claimed], dtype=np.int64)
    gone = np.array([int(key[1:]) % capacity for key in scenario.deleted], dtype=np.int64)
    counts = ClaimCounts(capacity)
    model = [0] * capacity
    counts.add(slots)
    for slot in slots.tolist():
        model[slot] += 1
    assert counts.counts.tolist() == model
    assert counts.claimed == sum(1 for c in model if c)
    emptied = counts.remove(gone)
    expected = set()
    for slot in gone.tolist():
        if model[slot]:
            model[slot] -= 1
            if not model[slot]:
                expected.add(slot)
    assert counts.counts.tolist() == model
    assert emptied.tolist() == sorted(expected)
    assert counts.claimed == sum(1 for c in model if c)


@given(claim_scenarios())
def test_claim_counts_of_distinct_slots_skip_the_sort_and_match(scenario: ClaimScenario) -> None:
    """add/remove with ``distinct`` (a read's claim) give what the general path gives, from
    any earlier counts: the same counts, claimed slots and emptied slots, ascending."""
    capacity = scenario.capacity
    earlier = np.array([int(key[1:]) % capacity for key in scenario.stored], dtype=np.int64)
    named = [int(key[1:]) % capacity for key in scenario.claimed + scenario.deleted]
    slots = np.array(list(dict.fromkeys(named)), dtype=np.int64)  # distinct, in order
    fast, general = ClaimCounts(capacity), ClaimCounts(capacity)
    for counts in (fast, general):
        counts.add(earlier)
    fast.add(slots, distinct=True)
    general.add(slots)
    assert fast.counts.tolist() == general.counts.tolist()
    assert fast.claimed == general.claimed
    once = slots[::2].copy()
    assert fast.remove(once, distinct=True).tolist() == general.remove(once).tolist()
    assert fast.remove(slots, distinct=True).tolist() == general.remove(slots).tolist()
    assert fast.counts.tolist() == general.counts.tolist()
    assert fast.claimed == general.claimed


def test_a_read_claims_its_keys_as_distinct_and_releases_them_all() -> None:
    """The claim a read takes says its keys are distinct; releasing it frees every count."""
    store = Store(8)
    keys = [f"k{i}" for i in range(5)]
    store.commit(store.reserve(keys), [True] * 5)
    claim = store.claim(keys, distinct=True)
    assert claim.distinct and store.stats().claimed == 5
    store.release(claim)
    assert store.stats().claimed == 0 and store.snapshot().claims.tolist() == [0] * 8
