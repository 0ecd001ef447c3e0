"""The ``file`` backend: each pool's pages in slot files under ``backend.options.path``.

Per pool the backend opens the pool's directory (:mod:`.directory`: lock, format, direct I/O
probe), fits its capacity under the tenant's quota and the free-space floor, recovers what the
directory holds (:mod:`.recovery`) and serves it through a :class:`~.tier.FileTier`. Bytes
move with the backend's own I/O engine (:mod:`.engine`; one per backend, shared by its
pools), not with the configured copy transport: a pool must live in host memory.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ClosedError, mismatch
from ..base import BackendContext, PoolSpec, check_device
from ..dram.stores import new_store
from ..reporting import TierUsage
from .directory import fit_capacity, open_files, pool_directory
from .engine import IOEngine, PoolSide, pool_view
from .options import FileOptions
from .tier import FileTier, Watermarks
from .transfer import FileRead, FileWrite

__all__ = ["FileBackend", "FilePool"]


class FilePool:
    """One pool's tier; the :class:`~..base.PoolTier` of ``file``."""

    def __init__(self, spec: PoolSpec, tier: FileTier) -> None:
        self.name = spec.name
        self.tier = tier
        endpoint = spec.endpoint
        # Moves through the page cache go between it and the pool itself (.inplace).
        view = pool_view(endpoint.address, endpoint.nbytes) if tier.files.cache >= 0 else None
        self.side = PoolSide(endpoint.address, spec.geometry, view)

    def contains(self, keys: Any) -> int:
        return self.tier.contains(keys)

    def read(self, keys: list[str], pages: np.ndarray) -> FileRead:
        return FileRead(self.tier, self.side, keys, pages)

    def write(self, keys: list[str], pages: np.ndarray) -> FileWrite:
        return FileWrite(self.tier, self.side, keys, pages)

    def delete(self, keys: Any) -> int:
        return self.tier.drop(list(keys))

    def clear(self) -> None:
        self.tier.clear()

    def probe(self, nbytes: int) -> None:
        self.tier.probe(nbytes)

    def stats(self) -> dict[str, Any]:
        return self.tier.stats()

    def usage(self) -> TierUsage:
        return self.tier.usage()

    def close(self) -> None:
        self.tier.close()


class FileBackend:
    """The built-in ``file`` backend; see the module docstring."""

    name = "file"
    capabilities: frozenset[str] = frozenset()
    devices = frozenset({"cpu"})

    def __init__(self, context: BackendContext, options: FileOptions) -> None:
        self.loaded = context.loaded
        if options.path is None:
            message = (
                "backend 'file' needs a folder for its slot files: set backend.options.path "
                "(e.g. --set backend.options.path=/mnt/nvme/kvcr)"
            )
            raise mismatch("backend.options.path", self.loaded.origin("backend.options"), message)
        self.options = options
        self.root = Path(options.path)
        self.placement = context.placement
        self.eviction = context.eviction
        self.engine = IOEngine(options.io_threads, int(options.buffer_bytes))
        self._pools: list[FilePool] = []
        self._lock = threading.Lock()
        self._closed = False

    def _wanted_bytes(self) -> int:
        """A new pool's bytes: its capacity, within what the tenant's quota leaves."""
        options = self.options
        wanted = int(options.capacity_bytes or self.loaded.config.placement.capacity_bytes)
        quota = options.tenant_quota_bytes.get(options.tenant)
        if quota is None:
            return wanted
        held = sum(p.tier.capacity * p.tier.files.page_bytes for p in self._pools)
        folder = self.root / options.tenant
        others = sum(f.stat().st_size for f in folder.glob("*/slots")) if folder.is_dir() else 0
        return min(wanted, max(0, int(quota) - max(held, others)))

    def attach(self, spec: PoolSpec) -> FilePool:
        check_device(spec, self.devices, "backend 'file'")
        geometry = spec.geometry
        origin = self.loaded.origin("backend.options")
        with self._lock:
            if self._closed:
                raise ClosedError("backend 'file' is closed; build a new pipeline")
            wanted = self._wanted_bytes() // geometry.page_bytes
            directory = pool_directory(self.root, self.options.tenant, geometry)
            files = open_files(directory, geometry, self.options.direct, origin)
            try:
                capacity = fit_capacity(files, max(wanted, 0), int(self.options.min_free_bytes))
                store = new_store(
                    self.placement,
                    capacity,
                    self.eviction,
                    f"file:{spec.name}",
                    self.loaded.config.placement.eviction,
                )
                marks = None
                if self.options.high_watermark is not None and self.options.low_watermark:
                    marks = Watermarks(self.options.high_watermark, self.options.low_watermark)
                tier = FileTier(
                    files,
                    capacity,
                    store,
                    self.engine,
                    sync=self.options.sync,
                    check=self.options.check,
                    preallocate=self.options.preallocate,
                    watermarks=marks,
                    name=spec.name,
                )
            except BaseException:
                files.close()
                raise
            pool = FilePool(spec, tier)
            self._pools.append(pool)
        return pool

    def describe(self) -> dict[str, Any]:
        return {
            "name": "file",
            "path": str(self.root),
            "io_engine": "thread pool of preadv/pwritev",
            "io_threads": self.options.io_threads,
            "direct_io": [p.tier.files.direct for p in self._pools],
            "read_pages": [p.tier.read_paths.snapshot() for p in self._pools],
        }

    def close(self) -> None:
        """Wait for every I/O job, then close each pool's files; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.engine.close()
        for pool in self._pools:
            pool.close()
