"""The eviction policy protocol: what a slot store calls when it uses, drops and must free
pages. Its own module, below both the strategies (an eviction strategy makes policies) and the
stores (which call them), so neither has to know the other.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Protocol, runtime_checkable

__all__ = ["EvictionPolicy"]


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
        (a lazy promotion); the store then calls :meth:`forget` for each slot returned."""
        ...
