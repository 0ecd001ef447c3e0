"""Built-in tier backends: ``dram`` (the default), ``peer`` (a ``kvcr-policy serve`` tier) and
``host`` (one tier per host for every process, shared memory)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..backends.base import BackendContext
from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterBackend, Registry

__all__: list[str] = []


@dataclass(frozen=True, slots=True)
class _Lazy:
    """A backend class imported only when a pipeline builds one (never at registration)."""

    module: str
    cls: str
    #: What the backend lets a coalescing strategy use under a config (``capabilities_for``).
    capabilities_for: Callable[[Any, Registry], frozenset[str]]
    #: It maps a tier of ``placement.capacity_bytes`` per pool in the calling process.
    maps_tiers: bool = False

    def __call__(self, context: BackendContext, options: NoOptions) -> Any:
        return getattr(importlib.import_module(self.module, __package__), self.cls)(
            context, options
        )


def _transport_capabilities(config: Any, registry: Registry) -> frozenset[str]:
    """``dram`` moves with its copy transport: what that transport can do."""
    factory = registry.get("transport", config.transport.name).factory
    return frozenset(getattr(factory, "capabilities", ()))


def _host_capabilities(config: Any, registry: Registry) -> frozenset[str]:
    return frozenset({"coalesce", "split"})  # PeerBackend.capabilities


def _ucx_capabilities(config: Any, registry: Registry) -> frozenset[str]:
    return frozenset({"coalesce", "split"})  # PeerBackend.capabilities; the peer may narrow


@hookimpl
def kvcr_register_backends(register: RegisterBackend) -> None:
    register(
        "dram",
        _Lazy("..backends.dram.backend", "DramBackend", _transport_capabilities, maps_tiers=True),
        description="a process-owned DRAM region per pool (placement)",
    )
    # The peer's UCX options live in [transport.options] (transport 'ucx'); ucxx itself is
    # imported only when the first pool attaches.
    register(
        "peer",
        _Lazy("..backends.peer.backend", "PeerBackend", _ucx_capabilities),
        description="another process's DRAM tier over UCX (serve)",
    )
    from ..backends.peer.host_options import HostOptions

    register(
        "host",
        _Lazy("..backends.peer.host_tier", "HostBackend", _host_capabilities, maps_tiers=True),
        options=HostOptions,
        description="one tier per host for every process and rank, through shared memory",
    )
