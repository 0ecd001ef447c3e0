"""``s3fifo``: an eviction strategy after S3-FIFO (Yang et al., "FIFO queues are all you need for
cache eviction", SOSP 2023).

Three FIFO queues: a small one (``small_share`` of the slots) that new pages enter, a main one,
and a ghost of the keys lately evicted from the small queue. A page read while in the small
queue (``promote_reads`` times) moves to the main queue when it reaches the small queue's end,
others leave the tier and their key goes to the ghost; a page whose key is in the ghost enters
the main queue directly. The main queue gives each page a second chance per read (up to 3).
So pages used once (the tail of a prompt that nobody repeats) leave quickly, and the heads of
shared prefixes (system prompts, earlier turns of a conversation) stay.

It shows that a third-party eviction policy reaches the ``dram`` tier, the peer's tiers and
``kvcr-policy plan --trace`` alike: the store calls it directly, page by page, under its lock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from kvcr_policy.plugin_api import EvictionSection, hookimpl, number_field

if TYPE_CHECKING:
    from kvcr_policy.plugin_api import RegisterStrategy

__all__ = ["S3FIFO", "S3FIFOOptions", "S3FIFOPolicy", "kvcr_register_strategies"]

_MAX_READS = 3  # reads remembered per page (two bits in the paper)


class S3FIFOOptions(BaseModel):
    """``[eviction.options]`` of the ``s3fifo`` strategy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    small_share: float = number_field(
        0.1, 0.001, 0.999, "Share of the slots for the small queue of new pages (0.001..0.999)."
    )
    promote_reads: int = number_field(
        1, 1, _MAX_READS, "Reads in the small queue that move a page to the main queue (1..3)."
    )


class S3FIFOPolicy:
    """One store's S3-FIFO queues (see the module docstring)."""

    name = "s3fifo"

    def __init__(self, capacity: int, options: S3FIFOOptions) -> None:
        self._small_target = max(1, int(capacity * options.small_share))
        self._ghost_size = max(1, capacity - self._small_target)
        self._promote = options.promote_reads
        self._small: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._main: OrderedDict[int, None] = OrderedDict()
        self._ghost: OrderedDict[Hashable, None] = OrderedDict()
        self._reads: dict[int, int] = {}
        self._keys: dict[int, Hashable] = {}

    def admit(self, slot: int, key: Hashable) -> None:
        self._reads[slot] = 0
        self._keys[slot] = key
        if key in self._ghost:
            del self._ghost[key]
            self._main[slot] = None
        else:
            self._small[slot] = None

    def touch(self, slot: int) -> None:
        reads = self._reads[slot]
        if reads < _MAX_READS:
            self._reads[slot] = reads + 1

    def forget(self, slot: int) -> None:
        # Victims left their queue in victims(); a deleted page is still in one.
        if slot in self._small:
            del self._small[slot]
        else:
            self._main.pop(slot, None)
        del self._reads[slot]
        del self._keys[slot]

    def victims(self, count: int, evictable: Callable[[int], bool]) -> list[int]:
        chosen: list[int] = []
        # Pages that may not go now (claimed by a read, or kept by this write) keep their place.
        kept_small: list[int] = []
        kept_main: list[int] = []
        small, main, reads = self._small, self._main, self._reads
        while len(chosen) < count and (small or main):
            if small and (len(small) + len(kept_small) >= self._small_target or not main):
                slot, _ = small.popitem(last=False)
                if not evictable(slot):
                    kept_small.append(slot)
                elif reads[slot] >= self._promote:
                    reads[slot] = 0
                    main[slot] = None  # read while new: it earns a place in the main queue
                else:
                    chosen.append(slot)
                    self._remember(self._keys[slot])
            else:
                slot, _ = main.popitem(last=False)
                if not evictable(slot):
                    kept_main.append(slot)
                elif reads[slot]:
                    reads[slot] -= 1
                    main[slot] = None  # a second chance: back to the queue's start
                else:
                    chosen.append(slot)
        for queue, kept in ((small, kept_small), (main, kept_main)):
            for slot in reversed(kept):  # back at the front, in their order
                queue[slot] = None
                queue.move_to_end(slot, last=False)
        return chosen

    def _remember(self, key: Hashable) -> None:
        ghost = self._ghost
        ghost[key] = None
        ghost.move_to_end(key)
        if len(ghost) > self._ghost_size:
            ghost.popitem(last=False)


class S3FIFO:
    """S3-FIFO: new pages in a small FIFO, pages read again in a main FIFO, a ghost of keys."""

    name = "s3fifo"

    def __init__(self, section: EvictionSection, options: S3FIFOOptions) -> None:
        self.options = options

    def new_policy(self, capacity: int) -> S3FIFOPolicy:
        return S3FIFOPolicy(capacity, self.options)


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register(
        "eviction",
        "s3fifo",
        S3FIFO,
        options=S3FIFOOptions,
        description="S3-FIFO: new pages in a small FIFO, re-read ones in a main FIFO, a ghost.",
    )
