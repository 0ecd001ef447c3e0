"""What a read of the ``file`` tier carries: the run asked for (:class:`ReadRequest`) and
the count of pages by the path that served them (:class:`ReadPaths`)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from .directory import TierFiles
from .inplace import PoolSide

__all__ = ["ReadPaths", "ReadRequest"]


class ReadPaths:
    """Pages read, by the path that served them: ``page_cache`` (hybrid files, taken without
    blocking), ``direct`` (``O_DIRECT``), ``buffered`` (through the page cache, which may
    have read the device)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts = {"page_cache": 0, "direct": 0, "buffered": 0}

    def add(self, path: str, pages: int) -> None:
        if pages:
            with self._lock:
                self.counts[path] += pages

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """One run of a read: slots ``first..`` of ``files`` into ``pages`` of ``side`` (None:
    recovery's check, the pages are only checked), each page's bytes checked against its
    CRC-32C in ``crcs``, the pages counted in ``paths`` by the path that served them."""

    files: TierFiles
    side: PoolSide | None
    first: int
    pages: np.ndarray
    crcs: np.ndarray
    paths: ReadPaths = field(default_factory=ReadPaths)
