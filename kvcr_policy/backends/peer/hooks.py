"""The peer registers itself, as any plugin does: the backends ``peer`` (another process's
tier over UCX) and ``host`` (one tier per host, through shared memory), the ``ucx`` transport
name whose options configure them, and the benchmark adapter.

Listed in :data:`kvcr_policy.plugins.BUILTIN_PLUGINS` by name; the backends are imported only
when a pipeline builds one, and ucxx only when the first pool attaches.
"""

from __future__ import annotations

from typing import Any

from ...hookspecs import hookimpl
from ...registry import Lazy, RegisterBackend, RegisterBenchBackend, RegisterTransport, Registry
from .host_options import HostOptions
from .transport import CAPABILITIES, UcxOptions, UcxTransport

__all__: list[str] = []


def peer_capabilities(config: Any, registry: Registry) -> frozenset[str]:
    """What the peer accepts before it is connected (a connected peer may narrow it)."""
    return CAPABILITIES


@hookimpl
def kvcr_register_backends(register: RegisterBackend) -> None:
    register(
        "peer",
        Lazy(f"{__package__}.backend", "PeerBackend", peer_capabilities),
        description="another process's DRAM tier over UCX (serve)",
    )
    register(
        "host",
        Lazy(f"{__package__}.host_tier", "HostBackend", peer_capabilities, maps_tiers=True),
        options=HostOptions,
        description="one tier per host for every process and rank, through shared memory",
    )


@hookimpl
def kvcr_register_transports(register: RegisterTransport) -> None:
    register("ucx", UcxTransport, options=UcxOptions, description="peer tier over UCX (serve)")


@hookimpl
def kvcr_register_bench_backends(register: RegisterBenchBackend) -> None:
    from .bench import PeerBench

    register(PeerBench)
