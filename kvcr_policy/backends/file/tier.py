"""One pool's ``file`` tier: its files, durable index, slot store and I/O, opened with recovery.

The slot store (:class:`~kvcr_policy.backends.dram.store.Store`, the same as ``dram``'s, its
policy made by the configured eviction strategy) decides which slot a key lives in, claims
slots for reads and reserves them for writes. Its slot numbers map to slots of the slot file
through ``fmap`` (a permutation): a fresh tier maps each slot to itself, and a reopened one
gives the recovered keys the store's first slots and maps them to the file slots their records
name. Every change of a key's slot takes :attr:`FileTier.lock`, so the on-disk records follow
the store in the order :mod:`.index` describes.

Eviction: a set that finds no free slot evicts through the store's policy, as ``dram`` does;
with watermarks, a commit that leaves more than ``high`` of the slots used evicts down to
``low`` so sets keep finding free slots.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ...errors import IndicesError
from ...observability.ledger import CallCounts, Ledger
from ..dram.store import Store
from ..reporting import TierUsage
from .directory import TierFiles, size_files
from .engine import IOEngine, PoolSide
from .index import SlotIndex, Sync
from .reads import ReadPaths
from .recovery import Check, Recovered, recover

__all__ = ["FileTier", "Moved", "Watermarks"]


@dataclass(frozen=True, slots=True)
class Watermarks:
    """Evict down to ``low`` of the slots once a commit leaves more than ``high`` used."""

    high: float
    low: float


class Moved:
    """Bytes a tier moved and the seconds of the calls that moved them (their rates in
    stats), kept in a call ledger (:class:`~kvcr_policy.observability.ledger.Ledger`)."""

    def __init__(self, page_bytes: int) -> None:
        self.page_bytes = page_bytes
        self.ledger = Ledger()

    def add(self, read: bool, pages: int, seconds: float) -> None:
        """One get (``read``) or set that moved ``pages`` pages in ``seconds``."""
        self.ledger.record(CallCounts(read, pages=pages), self.page_bytes)
        self.ledger.timed("get" if read else "set", seconds)

    def figures(self) -> dict[str, Any]:
        totals = self.ledger.snapshot({}, {})
        read_s, write_s = totals.seconds.get("get", 0.0), totals.seconds.get("set", 0.0)
        read, written = totals.bytes_read, totals.bytes_written
        return {
            "read_bytes": read,
            "read_s": read_s,
            "written_bytes": written,
            "write_s": write_s,
            "read_gbps": read / read_s / 1e9 if read_s else 0.0,
            "write_gbps": written / write_s / 1e9 if write_s else 0.0,
        }


class FileTier:
    """One pool's tier in ``files``; see the module docstring."""

    def __init__(
        self,
        files: TierFiles,
        capacity: int,
        store: Store,
        engine: IOEngine,
        *,
        sync: Sync = "batch",
        check: Check = "records",
        preallocate: bool = True,
        watermarks: Watermarks | None = None,
        name: str = "kv",
    ) -> None:
        self.name = name
        self.files = files
        self.capacity = capacity
        self.store = store
        self.engine = engine
        self.watermarks = watermarks
        self.lock = threading.Lock()
        self.moved = Moved(files.page_bytes)
        self.damaged_reads = 0
        self.read_paths = ReadPaths()
        self.watermark_evictions = 0
        self.check = check
        self._probe_buffer: mmap.mmap | None = None
        started = time.perf_counter()
        recovered = recover(files, capacity, check, engine)
        size_files(files, capacity, preallocate)
        self.index = SlotIndex(files, capacity, sync)
        self.index.retire([s for s in recovered.dropped if s < capacity], force=True)
        self.index.load(recovered.records)
        self.fmap = self._adopt(recovered)
        self.recovered = {
            "pages": len(recovered.records),
            "dropped": recovered.reasons,
            "open_s": round(time.perf_counter() - started, 6),
        }

    def _adopt(self, recovered: Recovered) -> np.ndarray:
        """Publish the recovered keys in the store, oldest write first; the slot map."""
        fmap = np.full(self.capacity, -1, dtype=np.int64)
        records = recovered.records
        if records:
            reservation = self.store.reserve([r.key for r in records])
            self.store.commit(reservation, [True] * len(records))
            fmap[reservation.slots] = [r.slot for r in records]
        unused = np.ones(self.capacity, dtype=bool)
        unused[[r.slot for r in records]] = False
        fmap[fmap < 0] = np.flatnonzero(unused)
        return fmap

    def side(self, address: int, geometry: Any) -> PoolSide:
        return PoolSide(address, geometry)

    def contains(self, keys: Any) -> int:
        return self.store.contains_prefix(keys)

    def drop(self, keys: list[str]) -> int:
        """Delete ``keys`` and tombstone their records (a deleted key never comes back)."""
        with self.lock:
            slots = self.store.lookup(keys)
            removed = self.store.delete(keys)
            self.index.retire(self.fmap[slots[slots >= 0]].tolist())
        return removed

    def clear(self) -> None:
        with self.lock:
            self.store.clear()
            self.index.clear()

    def after_commit(self) -> None:
        """Watermark eviction (caller holds the lock): records stay until a slot is reused,
        so an evicted page may come back after a restart, with its own intact bytes."""
        marks = self.watermarks
        if marks is None:
            return
        used = self.store.stats().used
        if used > marks.high * self.capacity:
            evicted = self.store.evict(used - int(marks.low * self.capacity))
            self.watermark_evictions += evicted

    def stats(self) -> dict[str, Any]:
        store = self.store.stats() if not self.store.closed else None
        return {
            "path": str(self.files.directory),
            "direct_io": self.files.direct,
            "io": "hybrid" if self.files.hybrid else "direct" if self.files.direct else "buffered",
            "page_bytes": self.files.page_bytes,
            "slot_stride": self.files.stride,
            "slots": self.capacity,
            "capacity_bytes": self.capacity * self.files.page_bytes,
            "eviction": self.store.eviction,
            "sync": "batch" if self.index.sync else "none",
            "fdatasyncs": self.index.syncs,
            "check": self.check,
            "recovered": self.recovered,
            "store": asdict(store) if store is not None else None,
            "io_threads": self.engine.threads,
            **self.moved.figures(),
            "read_pages": self.read_paths.snapshot(),
            "damaged_reads": self.damaged_reads,
            "watermark_evictions": self.watermark_evictions,
        }

    def usage(self) -> TierUsage:
        s = self.store.stats()
        page = self.files.page_bytes
        return TierUsage(s.capacity * page, s.used * page, s.evictions)

    def probe(self, nbytes: int) -> float:
        """Seconds of one sequential read of ``nbytes`` from the slot file's start (direct I/O
        where the tier uses it) into a page-aligned buffer: the tier's limit. The buffer is
        kept for the next probe, faulted in when made, so a probe after the first times the
        file system alone."""
        size = -(-nbytes // 4096) * 4096
        if size > self.capacity * self.files.stride:
            message = (
                f"pool {self.name!r}: probe of {nbytes} bytes reads past the slot file; probe "
                f"at most {self.capacity * self.files.stride}"
            )
            raise IndicesError(message)
        buffer = self._probe_buffer
        if buffer is None or len(buffer) != size:
            if buffer is not None:
                buffer.close()
            buffer = self._probe_buffer = mmap.mmap(-1, size)
            buffer.write(bytes(size))
        start = time.perf_counter()
        os.preadv(self.files.data, [buffer], 0)
        return time.perf_counter() - start

    def close(self) -> None:
        """After every transfer ended: the store refuses calls, the files close (the lock with
        them); the engine is the backend's."""
        self.store.close()
        self.files.close()
        if self._probe_buffer is not None:
            self._probe_buffer.close()
            self._probe_buffer = None
