"""PeerPool: a pool whose tier lives on a peer; the RemotePool the pipeline delegates to.

It owns what the local pipeline does for its own tier: metadata queries in query batches
(one round trip each), reads and writes in read batches bounded by the delivery window
(batches, pages, bytes in flight), and the fallback strategy for a batch that failed. Every
batch's descriptors are shaped by the configured coalescing strategy (:meth:`PeerPool.shape`),
within what both the pipeline and the peer allow. A peer that went away turns into misses
(logged and counted), never into an exception on the data path; a full tier raises
CapacityError, as the local store does.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

import numpy as np

from kvcr_policy.descriptors import Descriptors
from kvcr_policy.errors import CapacityError, ClosedError, TransportError, UnsupportedError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.schema import PolicyConfig

from ...dram.transports.base import Endpoint
from ..requests import memory_view
from ..wire import messages as m
from ..wire.payload import MAX_DESCRIPTORS, MAX_KEYS
from . import ops
from .client import PeerClient

__all__ = ["PeerPool"]

log = logging.getLogger("kvcr_policy.backends.peer.client.pool")


def _cap(batches: list[tuple[int, int]], most: int = MAX_KEYS) -> list[tuple[int, int]]:
    """Batches cut to at most ``most`` entries (one request names at most MAX_KEYS)."""
    out: list[tuple[int, int]] = []
    for start, stop in batches:
        out.extend((a, min(a + most, stop)) for a in range(start, stop, most))
    return out


class PeerPool:
    """See the module docstring; made by :meth:`UcxTransport.attach_pool`."""

    def __init__(
        self,
        client: PeerClient,
        name: str,
        geometry: PoolGeometry,
        endpoint: Endpoint,
        strategies: Mapping[str, Any],
        config: PolicyConfig,
    ) -> None:
        self.client = client
        self.name = name
        self.geometry = geometry
        self._buffer = endpoint.buffer  # keeps the pool memory alive while views exist
        self.align = endpoint.address % m.ALIGN_BYTES
        self.view = memory_view(endpoint.address, endpoint.nbytes)
        self.batching = strategies["batching"]
        self.fallback = strategies["fallback"]
        self.coalescing = strategies["coalescing"]
        # What the pipeline lets the strategy use; narrowed to what the peer accepts on connect.
        self.allowed = frozenset(strategies.get("allowed", self.coalescing.needs))
        self.usable = self.allowed
        # Plain descriptors of one batch must fit one SEND or POST.
        self.batch_pages = max(1, min(MAX_KEYS, MAX_DESCRIPTORS // geometry.fragments_per_page))
        self.on_unsupported = config.coalescing.on_unsupported
        self.timeout = config.transport.op_timeout_s
        self.counters: Counter[str] = Counter()
        self._warned = False
        self._closed = False
        self.client.register(self)

    # ---- what the client asks of a pool ---------------------------------------------------

    def shape(self, descriptors: Descriptors) -> Descriptors:
        """The descriptors to move for one batch: the coalescing strategy's, within ``usable``."""
        prepared: Descriptors = self.coalescing.prepare(descriptors, self.usable)
        return prepared

    def _negotiate(self, capabilities: frozenset[str]) -> None:
        missing = sorted(self.allowed - capabilities)
        if missing:
            message = (
                f"pool {self.name!r}: peer {self.client.address} cannot {' or '.join(missing)} "
                "descriptors, which the coalescing configuration asks for"
            )
            if self.on_unsupported == "error":
                raise UnsupportedError(message + "; set coalescing.on_unsupported = 'fallback'")
            if not self._warned:
                log.warning("%s; sending plain descriptors (coalescing.on_unsupported)", message)
                self._warned = True
        self.usable = self.allowed & capabilities

    def attach_message(self, capabilities: frozenset[str]) -> m.Attach:
        self._negotiate(capabilities)
        g = self.geometry
        return m.Attach(
            g.name,
            g.layout,
            g.layers,
            g.heads,
            g.head_dim,
            g.dtype,
            g.page_size,
            g.tokens,
            g.mla,
            self.align,
        )

    def target(self, number: int, slots: int, capabilities: frozenset[str]) -> ops.Target:
        self._negotiate(capabilities)
        return ops.Target.make(number, self.geometry, slots, self.view)

    # ---- RemotePool -----------------------------------------------------------------------

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise ClosedError(f"peer pool {self.name!r} is closed: {call}() refused")

    def _miss(self, call: str, err: Exception) -> None:
        self.counters[f"{call}_errors"] += 1
        log.warning("pool %r: %s on peer %s failed: %s", self.name, call, self.client.address, err)

    def exists(self, keys: Sequence[str]) -> int:
        self._check_open("exists")
        keys = list(keys)
        for start, stop in _cap(self.batching.query_batches(len(keys))):
            chunk = keys[start:stop]
            try:
                reply = self.client.request(self, partial(m.Exists, keys=chunk), self.timeout)
            except TransportError as err:
                self._miss("exists", err)
                return start
            self.counters["query_batches"] += 1
            if reply.count < len(chunk):
                return start + min(int(reply.count), len(chunk))
        return len(keys)

    def get(
        self, keys: Sequence[str], pages: np.ndarray, on_ready: Callable[[int], None] | None
    ) -> np.ndarray:
        self._check_open("get")
        return self._move(ops.read, list(keys), pages, on_ready)

    def set(self, keys: Sequence[str], pages: np.ndarray) -> np.ndarray:
        self._check_open("set")
        return self._move(ops.write, list(keys), pages, None)

    def _move(
        self,
        op: Callable[..., None],
        keys: list[str],
        pages: np.ndarray,
        on_ready: Callable[[int], None] | None,
    ) -> np.ndarray:
        """Batches within the window, in order; the fallback strategy for a failed batch. A read
        stops issuing batches after a page that did not arrive (only the leading run is used),
        as the local pipeline does; a write goes on, as the local store does."""
        n = len(keys)
        ok = np.zeros(n, dtype=bool)
        window = self.batching.window
        page_bytes = self.geometry.page_bytes
        inflight: deque[tuple[Future[Any], int, int]] = deque()
        state: dict[str, Any] = {"pages": 0, "stop": False, "error": None}
        reading = op is ops.read

        def finish() -> None:
            future, start, stop = inflight.popleft()
            state["pages"] -= stop - start
            result = self.client.wait(future, self.timeout, op.__name__)
            if isinstance(result, CapacityError):
                if start == 0:
                    state["error"] = result  # as the local store: nothing fits at all
                state["stop"] = True
            elif isinstance(result, Exception):
                self._miss(op.__name__, result)
                self.counters["fallback_pages"] += stop - start

                def retry(i: int) -> bool:
                    one = self.client.run(
                        self,
                        op,
                        keys[start + i : start + i + 1],
                        pages[start + i : start + i + 1],
                        self.shape,
                        timeout=self.timeout,
                    )
                    return bool(one[0])

                ok[start:stop] = self.fallback.recover(stop - start, retry)
            else:
                ok[start:stop] = result[: stop - start]
            self.counters["batches"] += 1
            if reading and not ok[start:stop].all():
                state["stop"] = True
            elif on_ready is not None and ok[:stop].all():
                on_ready(stop)

        for start, stop in _cap(self.batching.read_batches(n), self.batch_pages):
            if state["stop"]:
                break
            count = stop - start
            while inflight and not window.admits(
                len(inflight),
                state["pages"],
                state["pages"] * page_bytes,
                count,
                count * page_bytes,
            ):
                finish()
            if state["stop"]:
                break
            future = self.client.start(self, op, keys[start:stop], pages[start:stop], self.shape)
            inflight.append((future, start, stop))
            state["pages"] += count
        while inflight:
            finish()
        if state["error"] is not None:
            raise state["error"]
        self.counters["pages_read" if reading else "pages_written"] += int(ok.sum())
        return ok

    def delete(self, keys: Sequence[str]) -> int:
        self._check_open("delete")
        keys = list(keys)
        total = 0
        for start, stop in _cap([(0, len(keys))]):
            chunk = keys[start:stop]
            reply = self.client.request(self, partial(m.Delete, keys=chunk), self.timeout)
            total += int(reply.count)
        return total

    def clear(self) -> None:
        self._check_open("clear")
        self.client.request(self, m.Clear, self.timeout)

    def probe(self, nbytes: int) -> bool:
        """One UCX message of ``nbytes`` from the peer's tier into this pool (benchmarks)."""
        return bool(self.client.run(self, ops.probe, nbytes, timeout=self.timeout))

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = {**self.client.describe(), "counters": dict(self.counters)}
        if not self._closed:
            try:
                reply = self.client.request(self, m.Stats, self.timeout)
                data["remote"] = json.loads(reply.text)
            except (TransportError, ValueError) as err:
                data["remote_error"] = str(err)
        return data

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.client.unregister(self)
        self.view = np.zeros(0, dtype=np.uint8)
        self._buffer = None
