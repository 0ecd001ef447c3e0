"""The eviction policy protocol: what a slot store calls when it uses, drops and must free
pages. Its own module, below both the strategies (an eviction strategy makes policies) and the
stores (which call them), so neither has to know the other.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Evictable", "EvictionPolicy"]


@dataclass(frozen=True, slots=True)
class Evictable:
    """What a store passes as ``evictable`` to :meth:`EvictionPolicy.victims`: a slot may be
    evicted unless it is in ``busy`` (claimed by a read, held by a write, or protected). A
    policy calls it per slot, or filters by ``busy`` in bulk (the built-in ones do)."""

    busy: frozenset[int]

    def __call__(self, slot: int) -> bool:
        return slot not in self.busy


@runtime_checkable
class EvictionPolicy(Protocol):
    """Orders one store's published slots for eviction; one instance serves one store.

    The store calls it under its own lock (no locking needed here), once per slot used, never
    through a hook. Slots are identities: choices may depend on the order of the calls and on
    the keys, never on slot numbers (``kvcr-policy plan --trace`` replays the same calls with
    other numbers and must choose the same victims).
    """

    #: The strategy's name, for messages.
    name: str

    def admit(self, slot: int, key: Hashable) -> None:
        """``slot`` now holds ``key``, just published (a set committed)."""
        ...

    def touch(self, slot: int) -> None:
        """``slot`` was used: read by a get, or written again by a set of its present key."""
        ...

    def forget(self, slot: int) -> None:
        """``slot`` no longer holds a key (evicted, deleted or cleared)."""
        ...

    def victims(self, count: int, evictable: Callable[[int], bool]) -> list[int]:
        """Up to ``count`` distinct held slots for which ``evictable`` is true, first victim
        first: as many as there are, up to ``count``. The policy may reorder what it keeps
        (a lazy promotion); the store then calls :meth:`forget` for each slot returned.
        A store's ``evictable`` is an :class:`Evictable`.

        A policy may also have ``admit_many(slots, keys)``, ``touch_many(slots)`` and
        ``forget_many(slots)``: each does what the one-slot call does for every slot, in
        order, and a store calls it in place of a loop of them."""
        ...
