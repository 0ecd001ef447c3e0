"""Eviction policies: which published slot of a store's tier to give up first.

A :class:`~.store.Store` asks its policy for victims when free slots run short;
:data:`EVICTION_POLICIES` maps the names a config may use to policy factories.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Protocol

__all__ = ["EVICTION_POLICIES", "EvictionPolicy", "FIFOPolicy", "LRUPolicy"]


class EvictionPolicy(Protocol):
    """Orders published slots for eviction.

    The store calls it under its own lock, so an implementation needs no locking; one instance
    serves one store. ``victims`` returns up to ``count`` slots for which ``evictable`` is true,
    first victim first, without changing its own order (the store then calls ``forget``).
    """

    name: str

    def admit(self, slot: int) -> None: ...
    def touch(self, slot: int) -> None: ...
    def forget(self, slot: int) -> None: ...
    def victims(self, count: int, evictable: Callable[[int], bool]) -> list[int]: ...


class LRUPolicy:
    """Least recently used first; a get (claim) or set (commit, or reserve of a present key)
    counts as a use. Lookups do not: an exists query is followed by the get that uses it."""

    __slots__ = ("_order",)
    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def admit(self, slot: int) -> None:
        self._order[slot] = None

    def touch(self, slot: int) -> None:
        self._order.move_to_end(slot)

    def forget(self, slot: int) -> None:
        del self._order[slot]

    def victims(self, count: int, evictable: Callable[[int], bool]) -> list[int]:
        chosen: list[int] = []
        if count <= 0:
            return chosen
        for slot in self._order:
            if evictable(slot):
                chosen.append(slot)
                if len(chosen) == count:
                    break
        return chosen


class FIFOPolicy(LRUPolicy):
    """First published first; uses do not reorder."""

    __slots__ = ()
    name = "fifo"

    def touch(self, slot: int) -> None:
        pass


EVICTION_POLICIES: Mapping[str, Callable[[], EvictionPolicy]] = MappingProxyType(
    {"lru": LRUPolicy, "fifo": FIFOPolicy}
)
