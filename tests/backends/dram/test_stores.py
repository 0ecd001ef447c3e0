"""new_store: every slot store gets a fresh policy of the configured eviction strategy; a
placement written before eviction became a strategy keeps working, and is told about."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from kvcr_policy.backends.dram.store import Store
from kvcr_policy.backends.dram.stores import new_store
from kvcr_policy.builtin.eviction import FIFOEviction, FIFOPolicy, LRUEviction, LRUPolicy
from kvcr_policy.builtin.placement import AnonymousPlacement
from kvcr_policy.config.schema import EvictionSection, PlacementSection
from kvcr_policy.registry import NoOptions

FIFO = FIFOEviction(EvictionSection(), NoOptions())
LRU = LRUEviction(EvictionSection(), NoOptions())


class OldPlacement:
    """A placement whose new_store predates the eviction argument."""

    def new_store(self, capacity: int) -> Store:
        return Store(capacity)  # LRU


def test_the_placement_gets_a_fresh_policy_per_store() -> None:
    placement = AnonymousPlacement(PlacementSection(), NoOptions())
    first, second = (new_store(placement, 4, FIFO, "tier:kv") for _ in range(2))
    assert first.eviction == second.eviction == "fifo"
    assert isinstance(first._policy, FIFOPolicy) and first._policy is not second._policy


def test_without_a_strategy_the_store_keeps_placement_eviction() -> None:
    section = PlacementSection(eviction="fifo")
    placement = AnonymousPlacement(section, NoOptions())
    assert new_store(placement, 4, None, "tier:kv", section.eviction).eviction == "fifo"


def test_an_older_placement_keeps_its_policy_and_a_warning_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "kvcr_policy.backends.dram"):
        store = new_store(OldPlacement(), 4, FIFO, "tier:kv")
    assert store.eviction == "lru"
    assert "evicts with 'lru', not the configured eviction strategy 'fifo'" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "kvcr_policy.backends.dram"):
        assert isinstance(new_store(OldPlacement(), 4, LRU, "tier:kv")._policy, LRUPolicy)
    assert caplog.text == ""  # the policy it keeps is the configured one


def test_a_strategy_that_fails_leaves_nothing_behind() -> None:
    class Broken:
        def new_policy(self, capacity: int) -> Any:
            raise RuntimeError("no policy today")

    placement = AnonymousPlacement(PlacementSection(), NoOptions())
    with pytest.raises(RuntimeError, match="no policy today"):
        new_store(placement, 4, Broken(), "tier:kv")
