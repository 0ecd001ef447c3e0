"""Built-in placement: an anonymous process-owned region with optional THP and NUMA policy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterStrategy
from ..schema import PlacementSection

if TYPE_CHECKING:
    from ..backends.dram.store import Store
    from ..backends.dram.tier import Region

__all__ = ["AnonymousPlacement"]


class AnonymousPlacement:
    """Anonymous mmap (MADV_DONTFORK), huge-page advice and NUMA policy as configured, audited.

    Defaults reproduce upstream: no pre-fault, no advice, no binding, LRU eviction.
    """

    def __init__(self, section: PlacementSection, options: NoOptions) -> None:
        self.section = section

    def open_region(self, name: str, size: int) -> Region:
        from ..backends.dram.tier import open_region

        s = self.section
        return open_region(
            size,
            name=name,
            prefault=s.prefault,
            huge_pages=s.huge_pages,
            numa_policy=s.numa_policy,
            numa_nodes=s.numa_nodes,
            numa_mode=s.numa_mode,
        )

    def new_store(self, capacity: int) -> Store:
        from ..backends.dram.store import Store

        return Store(capacity, eviction=self.section.eviction)


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register("placement", "anonymous", AnonymousPlacement)
