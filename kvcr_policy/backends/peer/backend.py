"""The ``peer`` backend: each pool's tier held by another process (``kvcr-policy serve``).

The ``ucx`` transport owns the UCX worker and the client connection (shared memory on one
host, tcp across); this backend attaches each pool through it and hands the pipeline the
:class:`~.client.pool.PeerPool` of each pool, which the mover drives like any other backend.
"""

from __future__ import annotations

from typing import Any

from kvcr_policy.errors import PoolError

from ..base import BackendContext, PoolSpec, check_device
from .client.pool import PeerPool
from .transport import UcxTransport

__all__ = ["PeerBackend"]


class PeerBackend:
    """The built-in ``peer`` backend; see the module docstring."""

    name = "peer"
    capabilities = frozenset({"coalesce", "split"})
    devices = frozenset({"cpu"})

    def __init__(self, context: BackendContext, options: Any) -> None:
        transport = context.transport
        if not isinstance(transport, UcxTransport):
            name = getattr(transport, "name", type(transport).__name__)
            message = (
                f"backend 'peer' reaches its tier over UCX, but transport.name is {name!r} "
                f"(from {context.loaded.origin('transport.name')}); set transport.name = 'ucx' "
                "and transport.options.peer = 'HOST:PORT'"
            )
            raise PoolError(message)
        self.transport = transport
        coalescing = context.coalescing
        # What the pipeline lets the strategy use here; each connection narrows it to what
        # that peer accepts (coalescing.on_unsupported decides when it cannot).
        self._strategies = {
            "coalescing": coalescing,
            "allowed": coalescing.needs & self.capabilities,
        }

    def attach(self, spec: PoolSpec) -> PeerPool:
        check_device(spec, self.devices, "transport 'ucx'")
        pool: PeerPool = self.transport.attach_pool(
            spec.name, spec.geometry, spec.endpoint, self._strategies
        )
        return pool

    def describe(self) -> dict[str, Any]:
        return self.transport.describe()

    def close(self) -> None:
        """The transport closes every pool, then the connection and the UCX worker."""
        self.transport.close()
