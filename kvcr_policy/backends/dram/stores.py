"""A pool's slot store, with a policy from the eviction strategy.

Every backend that keeps :class:`~.store.Store` s (``dram``, the peer server's tiers) builds
them here, so the configured eviction strategy reaches each one the same way: one fresh policy
per store, made once when the tier opens; the store then calls that plain object, never a hook.

The placement strategy opens regions only; the store is the backend's. A placement written when
it also built stores (a ``new_store(capacity[, eviction])`` method) is still called for them.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any

from .store import Store

if TYPE_CHECKING:
    from ...strategies import EvictionStrategy, PlacementStrategy

__all__ = ["new_store", "takes"]

log = logging.getLogger("kvcr_policy.backends.dram")


def takes(function: Any, name: str) -> bool:
    """Whether ``function`` accepts a keyword argument ``name`` (or any keyword)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return False
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)


def new_store(
    placement: PlacementStrategy,
    slots: int,
    eviction: EvictionStrategy | None,
    tier: str,
    default: str = "lru",
) -> Store:
    """The store of ``tier`` with ``slots`` slots, its policy made by ``eviction``.

    Without an eviction strategy the store evicts as ``default`` says (``placement.eviction``,
    the older spelling). Like pluggy's hook arguments: an older placement whose ``new_store``
    names ``eviction`` gets the policy; one written before eviction became a strategy keeps its
    one-argument call and its own policy, and a warning says so when that is not the
    configured one.
    """
    build: Any = getattr(placement, "new_store", None)
    if build is None:
        return Store(slots, eviction=default if eviction is None else eviction.new_policy(slots))
    if eviction is None:
        return build(slots)
    policy = eviction.new_policy(slots)
    if takes(build, "eviction"):
        return build(slots, eviction=policy)
    store = build(slots)
    kept = getattr(store, "eviction", None)
    if kept != policy.name:
        log.warning(
            "tier %r: placement strategy %s builds its store without an eviction argument, so "
            "it evicts with %r, not the configured eviction strategy %r",
            tier,
            type(placement).__name__,
            kept,
            policy.name,
        )
    return store
