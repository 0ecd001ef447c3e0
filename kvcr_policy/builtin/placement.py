"""Built-in placement: an anonymous process-owned region with optional THP and NUMA policy."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterStrategy
from ..schema import PlacementSection

if TYPE_CHECKING:
    from ..backends.dram.locality import DeviceLocality
    from ..backends.dram.store import Store
    from ..backends.dram.tier import NumaPolicy, Region
    from ..strategies import EvictionPolicy

__all__ = ["AnonymousPlacement"]


class AnonymousPlacement:
    """Anonymous mmap (MADV_DONTFORK), huge-page advice and NUMA policy as configured, audited.

    Defaults reproduce upstream: no pre-fault, no advice, no binding.
    ``numa_policy = "gpu"`` places each tier near the GPU of its pool (``device``, located by
    the transport); see :mod:`kvcr_policy.backends.dram.locality`.
    """

    def __init__(self, section: PlacementSection, options: NoOptions) -> None:
        self.section = section

    def open_region(self, name: str, size: int, device: DeviceLocality | None = None) -> Region:
        from ..backends.dram.locality import near_placement
        from ..backends.dram.tier import open_region

        s = self.section
        policy, nodes, near = str(s.numa_policy), s.numa_nodes, ""
        if policy == "gpu":
            plan = near_placement(name, device, s.numa_mode)
            policy, nodes, near = plan.policy, plan.nodes, plan.note
        return open_region(
            size,
            name=name,
            prefault=s.prefault,
            huge_pages=s.huge_pages,
            numa_policy=cast("NumaPolicy", policy),
            numa_nodes=nodes,
            numa_mode=s.numa_mode,
            near=near,
        )

    def new_store(self, capacity: int, eviction: EvictionPolicy | None = None) -> Store:
        from ..backends.dram.store import Store

        # ``eviction`` is the policy the eviction strategy made for this store; without one,
        # the store evicts as placement.eviction says (the older spelling).
        return Store(capacity, eviction=self.section.eviction if eviction is None else eviction)


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register("placement", "anonymous", AnonymousPlacement)
