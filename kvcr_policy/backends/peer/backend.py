"""The ``peer`` backend: each pool's tier held by another process (``kvcr-policy serve``).

The ``ucx`` transport owns the UCX worker and the client connection (shared memory on one
host, tcp across); this backend turns each pool into a :class:`~..base.PoolTier`: one EXISTS
round trip per metadata-query batch, and one claimed read or reserved write per batch the
mover submits. A peer that went away turns into misses (logged and counted), never into an
exception on the data path; a full tier raises CapacityError as the local store does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import Any

import numpy as np

from ...errors import PoolError, TransportError
from ..base import BackendContext, PoolSpec, Shape, check_device
from . import messages as m
from . import ops
from .protocol import MAX_KEYS
from .transport import UcxTransport

__all__ = ["PeerBackend"]

log = logging.getLogger("kvcr_policy.backends.peer")


class _NoShape:
    """What the peer connection is told of coalescing: the mover shapes every batch."""

    needs: frozenset[str] = frozenset()

    def prepare(self, descriptors: Any, allowed: frozenset[str]) -> Any:
        return descriptors


_STRATEGIES = {"coalescing": _NoShape(), "allowed": frozenset(), "batching": None, "fallback": None}


class _Deadline(Future):
    """A future whose ``result()`` waits at most the op timeout (a peer that never answers
    fails the batch instead of hanging the caller)."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self._seconds = seconds

    def result(self, timeout: float | None = None) -> Any:
        try:
            return super().result(self._seconds if timeout is None else timeout)
        except FutureTimeout:
            message = f"the peer did not answer within {self._seconds:.1f} s"
            raise TransportError(message) from None


class _Transfer:
    """One get or set on a peer pool: every batch is claimed or reserved on the peer."""

    needs: np.ndarray | None = None

    def __init__(self, tier: _PeerTier, read: bool, keys: list[str], pages: np.ndarray) -> None:
        self.tier = tier
        self.op = ops.read if read else ops.write
        self.keys = keys
        self.pages = pages
        self.limit = len(keys)

    def submit(self, positions: np.ndarray, shape: Shape) -> Future[np.ndarray]:
        start, stop = int(positions[0]), int(positions[-1]) + 1  # the mover sends runs
        tier = self.tier
        chunks = [(a, min(a + MAX_KEYS, stop)) for a in range(start, stop, MAX_KEYS)]
        combined = _Deadline(tier.timeout + 1.0)
        results: list[Any] = [None] * len(chunks)
        left = [len(chunks)]

        def settle(i: int, future: Future[Any]) -> None:
            results[i] = future.result()
            left[0] -= 1
            if left[0]:
                return
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                combined.set_exception(errors[0])
            else:
                combined.set_result(np.concatenate(results))

        for i, (a, b) in enumerate(chunks):
            future = tier.client.start(tier.pool, self.op, self.keys[a:b], self.pages[a:b])
            future.add_done_callback(partial(settle, i))
        return combined

    def retry(self, position: int) -> bool:
        tier = self.tier
        one = tier.client.run(
            tier.pool,
            self.op,
            self.keys[position : position + 1],
            self.pages[position : position + 1],
            timeout=tier.timeout,
        )
        return bool(one[0])

    def finish(self, moved: np.ndarray) -> list[bool]:
        return [bool(x) for x in moved]

    def abort(self) -> None:
        """Nothing to undo here: each batch released its claim or reservation on the peer."""


class _PeerTier:
    """One pool attached to a peer; the :class:`~..base.PoolTier` of ``peer``."""

    def __init__(self, pool: Any, timeout: float) -> None:
        self.pool = pool
        self.client = pool.client
        self.timeout = timeout

    def _miss(self, call: str, err: Exception) -> None:
        self.pool.counters[f"{call}_errors"] += 1
        log.warning("pool %r: %s on peer %s failed: %s", self.pool.name, call, self.client.address,
                    err)  # fmt: skip

    def contains(self, keys: Sequence[str]) -> int:
        keys = list(keys)
        for start in range(0, len(keys), MAX_KEYS):
            chunk = keys[start : start + MAX_KEYS]
            try:
                reply = self.client.request(self.pool, partial(m.Exists, keys=chunk), self.timeout)
            except TransportError as err:
                self._miss("exists", err)
                return start
            self.pool.counters["query_batches"] += 1
            if reply.count < len(chunk):
                return start + min(int(reply.count), len(chunk))
        return len(keys)

    def begin(self, read: bool, keys: list[str], pages: np.ndarray) -> _Transfer:
        return _Transfer(self, read, keys, pages)

    def delete(self, keys: Sequence[str]) -> int:
        return int(self.pool.delete(keys))

    def clear(self) -> None:
        self.pool.clear()

    def probe(self, nbytes: int) -> None:
        if not self.pool.probe(nbytes):
            raise TransportError(f"pool {self.pool.name!r}: the probe of {nbytes} bytes failed")

    def stats(self) -> dict[str, Any]:
        return {"peer": self.pool.stats()}

    def audit(self) -> dict[str, Any] | None:
        return None  # the peer's placement is audited where it runs (`kvcr-policy serve`)

    def close(self) -> None:
        self.pool.close()


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
        self.timeout = context.config.transport.op_timeout_s

    def attach(self, spec: PoolSpec) -> _PeerTier:
        check_device(spec, self.devices, "transport 'ucx'")
        pool = self.transport.attach_pool(spec.name, spec.geometry, spec.endpoint, _STRATEGIES)
        return _PeerTier(pool, self.timeout)

    def describe(self) -> dict[str, Any]:
        return self.transport.describe()

    def close(self) -> None:
        """The transport closes every pool, then the connection and the UCX worker."""
        self.transport.close()
