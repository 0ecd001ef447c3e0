"""The transport interface: one batch of descriptors between two buffers, nothing more.

A transport moves the bytes a :class:`CopyBatch` describes; the pipeline owns batching,
windows, claims and fallback. ``submit`` returns a future so several batches can be in flight;
the default runs ``copy`` on a small thread pool.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcr_policy.backends.base import Endpoint
from kvcr_policy.descriptors import Descriptors
from kvcr_policy.errors import ClosedError, TransportError, UnimplementedError

from ....memory.cpus import spread_thread
from ....memory.locality import DeviceLocality

__all__ = ["CopyBatch", "Endpoint", "Transport", "check_bounds"]


@dataclass(frozen=True, slots=True)
class CopyBatch:
    """Copy ``descriptors`` (offsets relative to each endpoint) from ``src`` to ``dst``."""

    src: Endpoint
    dst: Endpoint
    descriptors: Descriptors
    #: From :meth:`Transport.read_ahead` for the read this batch belongs to, if it gave one.
    ticket: object = None


#: Buffers below this many bytes (2**62) cannot make an offset plus a length within them wrap
#: in int64, so :func:`_inside` may add them.
_SUMMABLE = 1 << 62


def check_bounds(batch: CopyBatch) -> None:
    """Refuse a batch any of whose descriptors falls outside either buffer (vectorised)."""
    d = batch.descriptors
    if len(d) == 0 or _inside(d, batch.src.nbytes, batch.dst.nbytes):
        return
    bad = (d.length <= 0) | (d.src < 0) | (d.dst < 0)
    # Room after the offset, never offset + length: that sum wraps in int64 past 2**63.
    bad |= d.length > batch.src.nbytes - np.clip(d.src, 0, None)
    bad |= d.length > batch.dst.nbytes - np.clip(d.dst, 0, None)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        message = (
            f"descriptor {i} (src {int(d.src[i])}, dst {int(d.dst[i])}, length "
            f"{int(d.length[i])}) falls outside its buffers (src {batch.src.nbytes} bytes, "
            f"dst {batch.dst.nbytes} bytes); refusing the batch instead of corrupting memory"
        )
        raise TransportError(message)


def _inside(d: Descriptors, src_bytes: int, dst_bytes: int) -> bool:
    """Whether every descriptor of ``d`` (not empty) lies inside both buffers, in reductions:
    this runs before each batch's first copy, and a mask per condition cost twice as much on
    a batch of 16,384 descriptors (48 against 23 us on a 2-core machine). False also where it
    cannot tell (buffers of 2**62 bytes or more): the caller then looks descriptor by
    descriptor."""
    if src_bytes >= _SUMMABLE or dst_bytes >= _SUMMABLE:
        return False
    if int(d.length.min()) <= 0 or int(d.src.min()) < 0 or int(d.dst.min()) < 0:
        return False
    if int(d.src.max()) > src_bytes or int(d.dst.max()) > dst_bytes:
        return False
    if int(d.length.max()) > min(src_bytes, dst_bytes):
        return False
    # Each term is now in [0, 2**62): their sums cannot wrap.
    return int((d.src + d.length).max()) <= src_bytes and int((d.dst + d.length).max()) <= dst_bytes


class Transport:
    """Base class: subclasses implement :meth:`copy`; :meth:`submit` adds concurrency."""

    name = "base"
    #: The backend that ``backend.name = "auto"`` picks for this transport.
    backend = "dram"
    #: What the transport can do with descriptors: {"coalesce", "split"}.
    capabilities: frozenset[str] = frozenset()
    #: Devices the endpoints may live on.
    devices: frozenset[str] = frozenset({"cpu"})
    #: The ``dram`` backend lays each tier slot out whole (one contiguous page) instead of
    #: mirroring the pool's planes; a transport that moves whole slots best sets it.
    whole_slots: bool = False
    #: ``attach_region`` pins the tier (DMA registration), which faults all of it in at once:
    #: the memory pre-flight holds such a tier to what is free now, as a pre-faulted one.
    pins_regions: bool = False

    def __init__(self, workers: int = 1) -> None:
        self._workers = max(1, workers)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def copy(self, batch: CopyBatch) -> None:
        """Move every byte of ``batch``; return when done; raise TransportError on failure."""
        raise UnimplementedError(
            f"transport {self.name!r} implements no copy(); subclass Transport and define it"
        )

    def submit(self, batch: CopyBatch) -> Future[None]:
        """Start ``batch``; the future completes when its bytes have moved."""
        with self._lock:
            if self._closed:
                raise ClosedError(f"transport {self.name!r} is closed; build a new pipeline")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self._workers, thread_name_prefix=f"kvcr-{self.name}", initializer=spread_thread
                )
            return self._pool.submit(self.copy, batch)

    def read_ahead(
        self, tier: Endpoint, pool: Endpoint, starts: Any, page_bytes: int, fragments: int
    ) -> object | None:
        """Optionally start moving a read's first pages before its first batch is planned: the
        tier slots at host offsets ``starts`` (int64, in the read's order; each slot one
        contiguous page of ``page_bytes``, ``fragments`` fragments in the pool) into
        transport-owned memory, never into ``pool``. Returns a ticket for the read's batches
        to carry (:attr:`CopyBatch.ticket`), or None. The caller keeps those slots unchanged
        until it calls :meth:`forget`. The base transport reads nothing ahead."""
        return None

    def forget(self, ticket: object) -> None:
        """Discard anything read ahead for ``ticket``."""

    def end_bytes(self) -> int | None:
        """How many bytes of a write's first and of its last batch to send as batches of their
        own: a batch's descriptors, bounds and plan cost the CPU in proportion to its size and
        none of its bytes cross before they are done, and the keys of a write's last batch are
        published after its last copy, the others while later batches copy. None (the base
        transport): batches as the batching strategy cuts them."""
        return None

    def attach_region(self, region: Endpoint, pool: Endpoint) -> None:
        """Prepare a tier region for copies to and from ``pool`` (e.g. pin it for DMA).

        Called once per pool when the ``dram`` backend attaches it, before any copy.
        """

    def detach_region(self, region: Endpoint) -> None:
        """Undo :meth:`attach_region`; called when the backend closes, after the last copy."""

    def pinned(self, region: Endpoint) -> tuple[int, float]:
        """Bytes of ``region`` that :meth:`attach_region` pinned for DMA, and its seconds."""
        return 0, 0.0

    def locate(self, endpoint: Endpoint) -> DeviceLocality | None:
        """The device ``endpoint`` lives on and its NUMA node; None for host memory."""
        return None

    def describe(self) -> dict[str, Any]:
        """What the transport reports about itself (shown in stats and the benchmark)."""
        return {"name": self.name, "capabilities": sorted(self.capabilities)}

    def close(self) -> None:
        """Wait for submitted batches, then release resources; idempotent."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
