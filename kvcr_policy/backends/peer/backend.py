"""The ``peer`` backend: each pool's tier held by another process (``kvcr-policy serve``).

The backend owns the UCX worker and the client connection (shared memory on one host, tcp
across), configured by ``[transport.options]`` of the ``ucx`` transport; it attaches each pool
over that connection and hands the pipeline the :class:`~.client.pool.PeerPool` of each pool,
which the mover drives like any other backend. On a shared-memory connection (a peer on this
host) pages are copied by a ``cpu`` copy engine of the backend's own (``transport.threads``
threads), as the ``dram`` backend copies them; a ``unix:`` peer needs no ucxx at all.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from kvcr_policy.errors import ClosedError, TransportError, mismatch

from ..base import BackendContext, PoolSpec, check_device
from ..dram.transports.cpu import CpuOptions, CpuTransport
from .client.pool import PeerPool
from .credentials import client_credentials
from .options import unix_address
from .transport import CAPABILITIES, UcxTransport, ucxx_available

__all__ = ["PeerBackend"]


class PeerBackend:
    """The built-in ``peer`` backend; see the module docstring."""

    name = "peer"
    capabilities = CAPABILITIES
    devices = frozenset({"cpu"})

    def __init__(self, context: BackendContext, options: Any) -> None:
        transport = context.transport
        if not isinstance(transport, UcxTransport):
            name = getattr(transport, "name", type(transport).__name__)
            message = (
                f"backend 'peer' reaches its tier over UCX, but transport.name is {name!r}; "
                "set transport.name = 'ucx' and transport.options.peer = 'HOST:PORT'"
            )
            raise mismatch("transport.name", context.loaded.origin("transport.name"), message)
        self.config = context.config
        self.options = transport.options
        # Read once, now: a missing or unsafe secret file is a config error of this build.
        self.credentials = client_credentials(context.loaded)
        self._init_state(context)

    def _init_state(self, context: BackendContext) -> None:
        coalescing = context.coalescing
        # What the pipeline lets the strategy use here; each connection narrows it to what
        # that peer accepts (coalescing.on_unsupported decides when it cannot).
        self._strategies = {
            "coalescing": coalescing,
            "allowed": coalescing.needs & self.capabilities,
        }
        self._copier: Any = None
        self._worker: Any = None
        self._client: Any = None
        self._pools: list[PeerPool] = []
        self._lock = threading.Lock()
        self._closed = False

    def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        unix = self.options.peer is not None and unix_address(self.options.peer) is not None
        if not unix and not ucxx_available():
            message = (
                "transport 'ucx' needs ucxx, which is not installed: "
                "pip install torch==2.13.0 -e '.[ucx]' in the kvcr-policy clone (PyPI "
                "ucxx-cu12); a peer on this host can be "
                "reached without it: transport.options.peer = 'unix:PATH'"
            )
            raise TransportError(message)
        from .client.client import PeerClient
        from .worker import acquire_worker

        worker = acquire_worker(self.options, ucx=not unix)
        copier = self._make_copier()
        try:
            client = PeerClient(
                worker,
                self.options,
                self.config.transport.op_timeout_s,
                name=f"pid {os.getpid()}",
                credentials=self.credentials,
                copier=copier,
                start=self._start,
            )
        except BaseException:
            worker.release()
            copier.close()
            raise
        self._worker, self._client, self._copier = worker, client, copier
        return client

    #: Called when a ``unix:`` peer is not running (the host backend starts its tier).
    _start: Any = None

    def _make_copier(self) -> Any:
        """The copy engine of shared-memory connections: a ``cpu`` transport."""
        return CpuTransport(self.config, CpuOptions())

    def attach(self, spec: PoolSpec) -> PeerPool:
        check_device(spec, self.devices, "transport 'ucx'")
        with self._lock:
            if self._closed:
                raise ClosedError("transport 'ucx' is closed; build a new pipeline")
            client = self._connect()
            pool = PeerPool(
                client, spec.name, spec.geometry, spec.endpoint, self._strategies, self.config
            )
            self._pools.append(pool)
            return pool

    def describe(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "name": "ucx",
            "capabilities": sorted(self.capabilities),
            "tls": self.options.tls,
            "shared_memory": self.options.shared_memory,
        }
        if self._client is not None:
            data.update(self._client.describe())
        if self._worker is not None:
            data["progress_mode"] = self._worker.progress_mode
            data["ucx_env"] = self._worker.env.to_dict()
            data["links"] = self._worker.describe()
        return data

    def close(self) -> None:
        """Close every pool, then the connection and the UCX worker; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pools, self._pools = self._pools, []
            client, self._client = self._client, None
            worker, self._worker = self._worker, None
            copier, self._copier = self._copier, None
        for pool in pools:
            pool.close()
        if client is not None:
            client.close()
        if copier is not None:
            copier.close()  # after the client: its last copies have finished
        if worker is not None:
            worker.release()
