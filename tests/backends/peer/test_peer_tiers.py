"""A peer server's tiers evict as the server's eviction strategy says (no UCX needed: the
tiers are plain objects the server builds from its configuration)."""

from __future__ import annotations

from kvcr_policy.backends.peer.server.tiers import Tiers
from kvcr_policy.builtin.eviction import FIFOEviction
from kvcr_policy.builtin.placement import AnonymousPlacement
from kvcr_policy.registry import NoOptions
from kvcr_policy.schema import EvictionSection, PlacementSection
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
    placement = AnonymousPlacement(PlacementSection(eviction="fifo"), NoOptions())
    tiers = Tiers(placement, 4 * geo.page_bytes, 4)
    try:
        assert tiers.open("default", geo).store.eviction == "fifo"
    finally:
        tiers.close()
