"""A ``file`` tier opened directly (no pipeline), a host pool of numpy pages, and page bytes
that are a function of their key, so any page served can be checked against its key."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from kvcr_policy.backends.dram.store import Store
from kvcr_policy.backends.file.directory import open_files, pool_directory
from kvcr_policy.backends.file.engine import IOEngine, PoolSide, pool_view
from kvcr_policy.backends.file.tier import FileTier
from kvcr_policy.backends.file.transfer import FileRead, FileWrite
from kvcr_policy.geometry import PoolGeometry
from tests.support.pools import geometry

__all__ = ["Rig", "expected", "small_geometry"]


def small_geometry(layout: str = "page_first", pages: int = 64) -> PoolGeometry:
    """Pages of 384 bytes: 3 layers, 2 heads, 8 dims, fp16, 2 tokens."""
    return geometry(layout, pages=pages, layers=3, head_dim=8, page_size=2)


def expected(key: str, page_bytes: int) -> bytes:
    """The bytes a page stored under ``key`` holds."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (page_bytes // len(seed) + 1))[:page_bytes]


class Rig:
    """A tier of ``slots`` slots in ``root`` over a numpy pool of ``geometry``; with
    ``in_place``, moves through the page cache go straight between it and the pool (as
    :class:`~kvcr_policy.backends.file.backend.FilePool` does), else through staging buffers
    (as the cascade's DRAM level does)."""

    def __init__(
        self, root: Path, geo: PoolGeometry, slots: int, in_place: bool = False, **tier: object
    ) -> None:
        self.geometry = geo
        self.pool = np.zeros(geo.nbytes, dtype=np.uint8)
        self.engine = IOEngine(4, 1 << 16)
        files = open_files(pool_directory(root, "t", geo), geo, tier.pop("direct", "auto"))  # type: ignore[arg-type]
        address = int(self.pool.ctypes.data)
        view = pool_view(address, geo.nbytes) if in_place and files.cache >= 0 else None
        self.side = PoolSide(address, geo, view)
        self.tier = FileTier(files, slots, Store(slots), self.engine, **tier)  # type: ignore[arg-type]

    def page(self, page: int) -> np.ndarray:
        """Page ``page`` of the pool as bytes in the tier's order (fragments back to back)."""
        from kvcr_policy.geometry import fragment_offsets

        g = self.geometry
        offsets = fragment_offsets(g, [page])[:, 0]
        return np.concatenate([self.pool[o : o + g.fragment_bytes] for o in offsets])

    def fill(self, page: int, key: str) -> None:
        from kvcr_policy.geometry import fragment_offsets

        g = self.geometry
        data = np.frombuffer(expected(key, g.page_bytes), dtype=np.uint8)
        for f, o in enumerate(fragment_offsets(g, [page])[:, 0]):
            self.pool[o : o + g.fragment_bytes] = data[
                f * g.fragment_bytes : (f + 1) * g.fragment_bytes
            ]

    def set(self, keys: list[str]) -> list[bool]:
        for page, key in enumerate(keys):
            self.fill(page, key)
        write = FileWrite(self.tier, self.side, keys, np.arange(len(keys)))
        positions = np.flatnonzero(write.needs)
        moved = np.zeros(write.limit, dtype=bool)
        moved[positions] = write.submit(positions, None).result()
        return write.finish(moved)

    def get(self, keys: list[str]) -> list[bool]:
        """Read ``keys`` into pages 0..n-1 (zeroed first); True where a page arrived."""
        self.pool[:] = 0
        read = FileRead(self.tier, self.side, keys, np.arange(len(keys)))
        positions = np.arange(read.limit)
        return read.finish(read.submit(positions, None).result())

    def close(self) -> None:
        self.engine.close()
        self.tier.close()
