"""Built-in eviction: 'lru' (upstream: least recently used first) and 'fifo' (first stored)."""

from __future__ import annotations

from ..backends.dram.eviction import FIFOPolicy, LRUPolicy
from ..config.schema import EvictionSection
from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterStrategy
from ..strategies import EvictionPolicy

__all__ = ["FIFOEviction", "LRUEviction"]


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
