"""The ucx transport: pools whose tier is held by a peer (``kvcr-policy serve``) over UCX.

It keeps no local tier: it belongs to the ``peer`` backend (:mod:`.backend`), for which
:meth:`UcxTransport.attach_pool` returns the :class:`~.client.pool.PeerPool` of each pool.
ucxx is imported only when the first pool attaches, on the UCX worker thread, after the UCX
environment knobs of ``[transport.options]`` were applied (see :mod:`.env`); without ucxx
installed the transport still validates and says what to install when it is used.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Mapping
from typing import Any

from kvcr_policy.errors import ClosedError, TransportError, UnsupportedError
from kvcr_policy.schema import PolicyConfig

from ..dram.transports.base import CopyBatch, Endpoint, Transport
from .options import UcxOptions

__all__ = ["UcxOptions", "UcxTransport", "ucxx_available"]


def ucxx_available() -> bool:
    """Whether the optional dependency ucxx (PyPI ucxx-cu12) can be imported."""
    return importlib.util.find_spec("ucxx") is not None


class UcxTransport(Transport):
    """See the module docstring."""

    name = "ucx"
    backend = "peer"
    capabilities = frozenset({"coalesce", "split"})
    devices = frozenset({"cpu"})

    def __init__(self, config: PolicyConfig, options: UcxOptions) -> None:
        super().__init__(workers=1)
        self.config = config
        self.options = options
        self._worker: Any = None
        self._client: Any = None
        self._pools: list[Any] = []
        self._attach_lock = threading.Lock()
        self.credentials: Any = None  # ClientCredentials, set by the peer backend

    def use_credentials(self, credentials: Any) -> None:
        """What this process proves itself with to its peer (before the first pool attaches)."""
        self.credentials = credentials

    def _connect(self) -> Any:
        if self._client is not None:
            return self._client
        if not ucxx_available():
            message = (
                "transport 'ucx' needs ucxx, which is not installed: "
                "pip install 'kvcr-policy[ucx]' (PyPI ucxx-cu12)"
            )
            raise TransportError(message)
        from .client.client import PeerClient
        from .worker import acquire_worker

        worker = acquire_worker(self.options)
        try:
            client = PeerClient(
                worker,
                self.options,
                self.config.transport.op_timeout_s,
                name=f"pid {os.getpid()}",
                credentials=self.credentials,
            )
        except BaseException:
            worker.release()
            raise
        self._worker, self._client = worker, client
        return client

    def attach_pool(
        self, name: str, geometry: Any, pool: Endpoint, strategies: Mapping[str, Any]
    ) -> Any:
        from .client.pool import PeerPool

        with self._attach_lock:
            if self._closed:
                raise ClosedError("transport 'ucx' is closed; build a new pipeline")
            client = self._connect()
            remote = PeerPool(client, name, geometry, pool, strategies, self.config)
            self._pools.append(remote)
            return remote

    def remote_pool(self, name: str) -> Any:
        """The PeerPool attached for pool ``name`` (its ``probe`` is the benchmark's limit)."""
        for remote in self._pools:
            if remote.name == name and not remote._closed:
                return remote
        raise KeyError(f"no pool {name!r} is attached to transport 'ucx'")

    def copy(self, batch: CopyBatch) -> None:
        message = (
            "transport 'ucx' moves pages between a pool and a peer's tier; it has no local "
            "tier to copy to (the pipeline delegates ucx pools to their PeerPool)"
        )
        raise UnsupportedError(message)

    def describe(self) -> dict[str, Any]:
        data: dict[str, Any] = {**super().describe(), "tls": self.options.tls}
        if self._client is not None:
            data.update(self._client.describe())
        if self._worker is not None:
            data["progress_mode"] = self._worker.progress_mode
            data["ucx_env"] = self._worker.env.to_dict()
            data["links"] = self._worker.describe()
        return data

    def close(self) -> None:
        with self._attach_lock:
            already = self._closed
            super().close()
            if already:
                return
            for remote in self._pools:
                remote.close()
            client, self._client = self._client, None
            worker, self._worker = self._worker, None
        if client is not None:
            client.close()
        if worker is not None:
            worker.release()
