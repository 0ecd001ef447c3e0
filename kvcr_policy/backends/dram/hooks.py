"""The ``dram`` backend registers itself, as any plugin does: the backend, its copy transports
(``cpu``, ``memory``, ``cuda``) and its benchmark adapter.

Listed in :data:`kvcr_policy.plugins.BUILTIN_PLUGINS` by name; nothing of the backend but its
options models is imported at registration (the backend when a pipeline builds one, torch when a
``cuda`` transport is built).
"""

from __future__ import annotations

from typing import Any

from ...hookspecs import hookimpl
from ...registry import Lazy, RegisterBackend, RegisterBenchBackend, RegisterTransport, Registry
from .transports.cpu import CpuOptions, CpuTransport
from .transports.cuda_options import CudaOptions, resolved_modes
from .transports.memory import MemoryOptions, MemoryTransport

__all__: list[str] = []


def transport_capabilities(config: Any, registry: Registry) -> frozenset[str]:
    """``dram`` moves with its copy transport: what that transport can do."""
    factory = registry.get("transport", config.transport.name).factory
    return frozenset(getattr(factory, "capabilities", ()))


class _Cuda:
    """The ``cuda`` transport's factory: torch is imported only when one is built, never at
    plugin registration."""

    def __call__(self, config: Any, options: CudaOptions) -> Any:
        from .transports.cuda import CudaTransport

        return CudaTransport(config, options)

    @staticmethod
    def keeps_whole_slots(options: CudaOptions, coalescing: str) -> bool:
        """Whether a transport with ``options`` keeps each tier slot one contiguous page under
        ``coalescing.strategy = coalescing``, resolved as the transport resolves it, without
        torch (``kvcr-policy plan`` asks; a transport without this mirrors the pool's planes)."""
        return resolved_modes(options, coalescing)[2]


@hookimpl
def kvcr_register_backends(register: RegisterBackend) -> None:
    register(
        "dram",
        Lazy(f"{__package__}.backend", "DramBackend", transport_capabilities, maps_tiers=True),
        description="a process-owned DRAM region per pool (placement)",
    )


@hookimpl
def kvcr_register_transports(register: RegisterTransport) -> None:
    register("cpu", CpuTransport, options=CpuOptions, description="memmove on host threads")
    register(
        "memory", MemoryTransport, options=MemoryOptions, description="checked copies for tests"
    )
    register("cuda", _Cuda(), options=CudaOptions, description="GPU pools, pinned tier, one stream")


@hookimpl
def kvcr_register_bench_backends(register: RegisterBenchBackend) -> None:
    from .bench import DramBench

    register(DramBench)
