"""MooncakeBackend: Mooncake Store as a kvcr_policy tier backend.

One Mooncake client per pipeline (started within ``connect_timeout_s``, see :mod:`.client`);
each pool the engine registers is registered with the store as it is (zero-copy) and served
by a :class:`~.pool.MooncakePool`. The pipeline's controls drive the store: the batching
strategy sizes each batch, the delivery window bounds the batches in flight (``threads``
worker threads, one batch each, cut into calls of at most ``call_buffers`` buffers; calls in
flight together never hold more transfers than the tcp transport queues per peer), the
fallback strategy retries a failed batch page by page (not the pages of a segment that did not
answer: :mod:`.pool`), every call ends within ``transport.op_timeout_s``, ``replicas`` /
``preferred_segment`` go with every put, and the store calls run at the priority
``call_priority`` chooses (:mod:`.priority`). Close order: every call finishes, each pool
unregisters its memory, then the client closes (its segment leaves the store).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from kvcr_policy.plugin_api import (
    BackendContext,
    ClosedError,
    PoolError,
    PoolSpec,
    stages_pages,
    strategy_name,
)

from .client import StoreClient
from .codes import describe
from .options import MooncakeOptions, resolved_call_priority
from .pool import MooncakePool
from .priority import CallThreads
from .staging import Staging

__all__ = ["MooncakeBackend"]


class MooncakeBackend:
    """The ``mooncake`` backend; see the module docstring."""

    name = "mooncake"
    # Each page is one object gathered from (or scattered to) its fragments in place: there
    # are no descriptors to merge or cut, so a coalescing profile sends them plain.
    capabilities: frozenset[str] = frozenset()
    # The non-CUDA transfer engine moves host memory only.
    devices = frozenset({"cpu"})

    def __init__(self, context: BackendContext, options: MooncakeOptions) -> None:
        self.options = options
        self.loaded = context.loaded
        window = context.config.batching.window_batches
        self.threads = options.threads or window or 1
        native = context.config.observability.native_logs
        origin = context.loaded.origin
        coalescing = strategy_name(context.config, "coalescing")  # what with_coalescing follows
        where = origin("backend.options.call_priority")  # only 'idle' can fail, never a default
        mode = resolved_call_priority(options, coalescing)
        # Every store call runs where call_priority says, the limit probe's too (priority.py).
        self.calls = CallThreads(mode, self.threads + 1, where)  # + 1: the limit probe
        try:
            self.client = StoreClient(options, origin, native, self.calls)
        except BaseException:
            self.calls.close()
            raise
        # A pool's limit probe gets a client of its own, contributing no segment (probe.py).
        self._connect = partial(
            StoreClient,
            options.model_copy(update={"segment_bytes": 0}),
            origin,
            native,
            self.calls,
        )
        # One call never holds more transfers than the tcp transport queues (client.py).
        self.call_buffers = min(options.call_buffers or self.client.queue, self.client.queue)
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="kvcr-mooncake")
        self._pools: list[MooncakePool] = []
        self._lock = threading.Lock()
        self._closed = False

    def run(self, work: Any, positions: np.ndarray) -> Future[np.ndarray]:
        """One batch on a worker thread."""
        with self._lock:
            if self._closed:
                raise ClosedError("backend 'mooncake' is closed; build a new pipeline")
            return self._executor.submit(work, positions)

    def attach(self, spec: PoolSpec) -> MooncakePool:
        device = spec.endpoint.device
        if device.split(":")[0] not in self.devices:
            message = (
                f"pool {spec.name!r} lives on {device}, but backend 'mooncake' moves host memory "
                "only (the pool is registered with the transfer engine for tcp or RDMA from "
                "the CPU); register a host pool (SGLang's host KV pool is one)"
            )
            raise PoolError(message)
        with self._lock:
            if self._closed:
                raise ClosedError("backend 'mooncake' is closed; build a new pipeline")
            code = self.client.register(spec.endpoint.address, spec.endpoint.nbytes)
            if code != 0:
                message = (
                    f"pool {spec.name!r}: Mooncake could not register its memory "
                    f"({spec.endpoint.nbytes} bytes at {spec.endpoint.address:#x}) for "
                    f"zero-copy transfers: {describe(code)}"
                )
                raise PoolError(message)
            op_timeout_s = self.loaded.config.transport.op_timeout_s
            try:
                area = self._staging(spec)
            except BaseException:
                self.client.unregister(spec.endpoint.address)
                raise
            pool = MooncakePool(
                spec, self.client, self.run, self.call_buffers, op_timeout_s, self._connect, area
            )
            self._pools.append(pool)
        return pool

    def _staging(self, spec: PoolSpec) -> Staging | None:
        """The pool's staging area where ``staging`` chooses one (:func:`.staging.staged`)."""
        o = self.options
        if not stages_pages(o.staging, spec.geometry, int(o.staging_below_bytes)):
            return None
        return Staging(self.client, spec, int(o.staging_bytes), self.threads)

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "threads": self.threads,
            "call_buffers": self.call_buffers,
            "staging": {pool.name: pool.stats()["staging"] for pool in self._pools},
            "call_priority": self.calls.describe(),
            **self.client.describe(),
        }

    def close(self) -> None:
        """Wait for every call, close each pool, then the client; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.shutdown(wait=True)  # every call returned before memory is unregistered
        try:
            for pool in self._pools:
                pool.close()
        finally:
            try:
                self.client.close()
            finally:
                self.calls.close()
