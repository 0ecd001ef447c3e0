"""Prober: a pool's limit probe, on a Mooncake client of its own.

The probe moves page-sized buffers (16 MiB for a ``qwen3-32b`` page). On the tcp transport a
client that has read such buffers reads small ones much slower from then on: 128 KiB
``layer_first`` fragments came at 2.3-2.7 GB/s on a fresh client and at 1.0-1.2 GB/s on the
same client after one probe, for as long as it was measured, while another client in the same
process stayed at 2.3-2.5 GB/s (tcp over loopback, 2 cores). A probe on the pool's own client
would slow the restores it is the limit of; on a client of its own it measures the same path
(the same segment, into the same registered pool memory) and leaves the pool's client alone.
The client is made at the first probe (``segment_bytes`` 0: it only reads and writes) and
closed with the pool.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from kvcr_policy.plugin_api import PoolError, TransportError

from .client import StoreClient
from .codes import STORED, describe
from .objects import ObjectPlan

__all__ = ["Prober"]


class Prober:
    """See the module docstring; ``connect()`` makes the probe's client."""

    def __init__(
        self,
        plan: ObjectPlan,
        nbytes: int,
        call_buffers: int,
        connect: Callable[[], StoreClient],
    ) -> None:
        self.plan = plan
        self.nbytes = nbytes  # the pool's
        self.call_buffers = call_buffers
        self.connect = connect
        self.client: StoreClient | None = None
        self.stored: set[str] = set()
        self._lock = threading.Lock()  # one probe at a time

    def _client(self) -> StoreClient:
        if self.client is None:
            client = self.connect()
            code = client.register(self.plan.address, self.nbytes)
            if code != 0:
                client.close()
                message = (
                    f"pool {self.plan.name!r}: the probe's Mooncake client could not register "
                    f"the pool's memory ({self.nbytes} bytes): {describe(code)}"
                )
                raise PoolError(message)
            self.client = client
        return self.client

    def probe(self, nbytes: int) -> None:
        """One ``batch_get_into`` of ``nbytes`` into the pool's first bytes: as many page-sized
        objects as the bytes make (whole multiples of a page if one call could not hold that
        many: ``call_buffers``), stored by the first probe of that size (so placed by the
        master as pages are), read back in one call into contiguous pool memory."""
        name = self.plan.name
        page = self.plan.geometry.page_bytes
        pages = -(-nbytes // page)  # rounded up
        piece = page * -(-pages // self.call_buffers)  # pages per object, so one call holds all
        sizes = [piece] * (nbytes // piece) + ([nbytes % piece] if nbytes % piece else [])
        starts = np.concatenate(([0], np.cumsum(sizes[:-1]))).astype(np.int64)
        pointers = (self.plan.address + starts).tolist()
        with self._lock:
            client = self._client()
            keys = [self.plan.probe_key(client.hostname, nbytes, i) for i in range(len(sizes))]
            if keys[0] not in self.stored:
                codes = client.put(keys, pointers, sizes, multi=False)
                failed = sorted({describe(c) for c in codes if c not in STORED})
                if failed:
                    message = f"pool {name!r}: storing the {nbytes}-byte probe failed: "
                    raise TransportError(message + ", ".join(failed))
                self.stored.update(keys)
            codes = client.get(keys, pointers, sizes, multi=False)
            if codes != sizes:
                self.stored.difference_update(keys)
                failed = sorted({describe(c) for c, n in zip(codes, sizes, strict=True) if c != n})
                message = f"pool {name!r}: the {nbytes}-byte probe read "
                raise TransportError(message + ", ".join(failed))

    def forget(self) -> None:
        """The pool was flushed: the probe objects are gone."""
        self.stored.clear()

    def close(self) -> None:
        """Remove the probe objects, unregister the pool memory, close the client."""
        client, self.client = self.client, None
        if client is None:
            return
        try:
            if self.stored and client.health.allows():
                client.remove(sorted(self.stored), force=True)
            client.unregister(self.plan.address)
        finally:
            client.close()
