"""Built-in eviction: 'lru' (upstream: least recently used first) and 'fifo' (first stored).

Each strategy makes one policy per store (:class:`LRUPolicy`, :class:`FIFOPolicy`); a store
asks its policy for victims when free slots run short. :data:`EVICTION_POLICIES` maps the
built-in names to their classes, for a store built by name (a store's default is ``lru``).
The protocol a policy follows is :class:`kvcr_policy.strategies.EvictionPolicy`.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from itertools import filterfalse, islice
from types import MappingProxyType

from ..config.schema import EvictionSection
from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterStrategy
from ..strategies import Evictable, EvictionPolicy

__all__ = ["EVICTION_POLICIES", "FIFOEviction", "FIFOPolicy", "LRUEviction", "LRUPolicy"]


class LRUPolicy:
    """Least recently used first; a get (claim) or set (commit, of a new or a present key)
    counts as a use. Lookups do not: an exists query is followed by the get that uses it."""

    __slots__ = ("_order",)
    name = "lru"

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def admit(self, slot: int, key: Hashable) -> None:
        self._order[slot] = None

    def admit_many(self, slots: Sequence[int], keys: Sequence[Hashable]) -> None:
        """:meth:`admit` of each slot in order (a store's commit). A plain loop: an ordered
        dict's ``update`` costs ten times more per key."""
        order = self._order
        for slot in slots:
            order[slot] = None

    def touch(self, slot: int) -> None:
        self._order.move_to_end(slot)

    def touch_many(self, slots: Iterable[int]) -> None:
        """:meth:`touch` of each slot in order, in one C loop (a store calls it, when a
        policy has it, for the slots of one claim)."""
        deque(map(self._order.move_to_end, slots), maxlen=0)

    def forget(self, slot: int) -> None:
        del self._order[slot]

    def forget_many(self, slots: Iterable[int]) -> None:
        """:meth:`forget` of each slot, in one C loop (a store's eviction)."""
        deque(map(self._order.__delitem__, slots), maxlen=0)

    def victims(self, count: int, evictable: Callable[[int], bool]) -> list[int]:
        chosen: list[int] = []
        if count <= 0:
            return chosen
        if isinstance(evictable, Evictable):  # the slots that must stay, filtered in C
            return list(islice(filterfalse(evictable.busy.__contains__, self._order), count))
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

    def touch_many(self, slots: Iterable[int]) -> None:
        pass


EVICTION_POLICIES: Mapping[str, Callable[[], EvictionPolicy]] = MappingProxyType(
    {"lru": LRUPolicy, "fifo": FIFOPolicy}
)


class LRUEviction:
    """Least recently used first: a get or a set of a page is a use (upstream)."""

    name = "lru"

    def __init__(self, section: EvictionSection, options: NoOptions) -> None:
        pass

    def new_policy(self, capacity: int) -> EvictionPolicy:
        return LRUPolicy()


class FIFOEviction(LRUEviction):
    """First stored first: uses do not reorder."""

    name = "fifo"

    def new_policy(self, capacity: int) -> EvictionPolicy:
        return FIFOPolicy()


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register("eviction", "lru", LRUEviction)
    register("eviction", "fifo", FIFOEviction)
