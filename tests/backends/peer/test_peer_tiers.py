"""A peer server's tiers evict as the server's eviction strategy says (no UCX needed: the
tiers are plain objects the server builds from its configuration)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvcr_policy.backends.peer.server.tiers import SLOT_COST, Tiers
from kvcr_policy.builtin.eviction import FIFOEviction
from kvcr_policy.builtin.placement import AnonymousPlacement
from kvcr_policy.config.schema import EvictionSection, PlacementSection
from kvcr_policy.errors import CapacityError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.registry import NoOptions
from tests.support.pools import geometry


def test_each_tier_store_takes_a_policy_of_the_strategy() -> None:
    geo = geometry(pages=4)
    placement = AnonymousPlacement(PlacementSection(), NoOptions())
    tiers = Tiers(
        placement, 4 * geo.page_bytes, 4, None, FIFOEviction(EvictionSection(), NoOptions())
    )
    try:
        first = tiers.open("default", geo)
        second = tiers.open("other", geo)
        assert first.store.eviction == second.store.eviction == "fifo"
        assert first.store._policy is not second.store._policy
    finally:
        tiers.close()


def test_without_a_strategy_the_tiers_keep_placement_eviction() -> None:
    geo = geometry(pages=4)
    section = PlacementSection(eviction="fifo")
    placement = AnonymousPlacement(section, NoOptions())
    tiers = Tiers(placement, 4 * geo.page_bytes, 4, placement_eviction=section.eviction)
    try:
        assert tiers.open("default", geo).store.eviction == "fifo"
    finally:
        tiers.close()


def _tiers(capacity: int, quota: int | None, max_tiers: int = 4) -> Tiers:
    placement = AnonymousPlacement(PlacementSection(), NoOptions())
    return Tiers(placement, capacity, max_tiers, quota)


def test_a_quota_pays_for_each_slots_bookkeeping() -> None:
    """Red team 2026-12-b, B1: 1-byte pages turned a 48 MiB quota into 25 million slots and
    600 MiB of bookkeeping; each slot now costs its page and SLOT_COST."""
    tiny = PoolGeometry("tiny", "page_first", 1, 1, 1, "float8_e4m3fn", 1, 16, True)
    assert tiny.page_bytes == 1
    quota = 48 << 20
    tiers = _tiers(quota, quota)
    try:
        tier = tiers.open("mallory", tiny)
        assert tier.slots == quota // (1 + SLOT_COST)
        assert tier.cost <= quota
        with pytest.raises(CapacityError, match="tenant_quota_bytes"):
            tiers.open("mallory", replace(tiny, name="tiny2"))
        assert tiers.open("alice", tiny).slots == tier.slots  # a quota is per tenant
    finally:
        tiers.close()


def test_a_tier_without_a_quota_counts_a_tiny_page_as_slot_cost() -> None:
    tiny = PoolGeometry("tiny", "page_first", 1, 1, 1, "float8_e4m3fn", 1, 16, True)
    big = geometry(pages=4, head_dim=1024)  # pages far above SLOT_COST: capacity as before
    assert big.page_bytes > SLOT_COST
    tiers = _tiers(64 * big.page_bytes, None)
    try:
        assert tiers.open("a", tiny).slots == 64 * big.page_bytes // SLOT_COST
        assert tiers.open("a", big).slots == 64
    finally:
        tiers.close()
