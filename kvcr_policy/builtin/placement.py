"""Built-in placement: an anonymous process-owned region with optional THP and NUMA policy."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from ..config.schema import PlacementSection
from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterStrategy

if TYPE_CHECKING:
    from ..memory.locality import DeviceLocality
    from ..memory.region import NumaPolicy, Region

__all__ = ["AnonymousPlacement"]


class AnonymousPlacement:
    """Anonymous mmap (MADV_DONTFORK), huge-page advice and NUMA policy as configured, audited.

    Defaults reproduce upstream: no pre-fault, no advice, no binding.
    ``numa_policy = "gpu"`` places each tier near the GPU of its pool (``device``, located by
    the transport); see :mod:`kvcr_policy.memory.locality`.
    """

    def __init__(self, section: PlacementSection, options: NoOptions) -> None:
        self.section = section

    def open_region(
        self,
        name: str,
        size: int,
        device: DeviceLocality | None = None,
        shared: bool = False,
    ) -> Region:
        from ..memory.locality import near_placement
        from ..memory.region import open_region

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
            shared=shared,
        )


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register("placement", "anonymous", AnonymousPlacement)
