"""Built-in tier backends: ``dram`` (the default) and ``peer`` (a ``kvcr-policy serve`` tier)."""

from __future__ import annotations

from typing import Any

from ..backends.base import BackendContext
from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterBackend

__all__: list[str] = []


def _dram(context: BackendContext, options: NoOptions) -> Any:
    from ..backends.dram.backend import DramBackend

    return DramBackend(context, options)


def _peer(context: BackendContext, options: NoOptions) -> Any:
    # The peer's UCX options live in [transport.options] (transport 'ucx'); ucxx itself is
    # imported only when the first pool attaches.
    from ..backends.peer.backend import PeerBackend

    return PeerBackend(context, options)


@hookimpl
def kvcr_register_backends(register: RegisterBackend) -> None:
    register("dram", _dram, description="a process-owned DRAM region per pool (placement)")
    register("peer", _peer, description="another process's DRAM tier over UCX (serve)")
