"""The wire plan: the descriptor list both peers compute for one transfer, and its digest.

A read is planned from the slots the server claimed and the pool pages the client named; a
write from the pool pages and the slots the server reserved. Both sides run the same
:func:`wire_plan` on the same inputs (coalesced and cut only as negotiated in the handshake),
so descriptor ``i`` is UCX message ``tag_base + i`` on both: the client posts its receives
straight into pool memory and the server sends straight from tier memory, no staging copy.
:func:`digest` lets the side that goes second check that both lists agree before any byte
moves.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from kvcr_policy.descriptors import Descriptors, build_descriptors, coalesce, split
from kvcr_policy.errors import TransportError

__all__ = ["WirePlan", "page_outcome", "wire_plan"]


@dataclass(frozen=True, slots=True)
class WirePlan:
    """Descriptors (``src``/``dst`` relative to each side's buffer) with their digest."""

    descriptors: Descriptors
    digest: int

    @property
    def count(self) -> int:
        return len(self.descriptors)

    @property
    def nbytes(self) -> int:
        return self.descriptors.nbytes

    def check(self, count: int, nbytes: int, digest: int, peer: str) -> None:
        """Raise TransportError unless the peer's plan matches this one."""
        if (count, nbytes, digest) != (self.count, self.nbytes, self.digest):
            message = (
                f"{peer} planned {count} messages / {nbytes} bytes (digest {digest:#x}) where "
                f"this side planned {self.count} / {self.nbytes} (digest {self.digest:#x}); "
                "the peers disagree on geometry or coalescing, refusing to move bytes"
            )
            raise TransportError(message)


def wire_plan(
    src_geometry: object,
    src_pages: np.ndarray,
    dst_geometry: object,
    dst_pages: np.ndarray,
    *,
    merge: bool,
    split_bytes: int,
) -> WirePlan:
    """Descriptors for pages ``src_pages[i] -> dst_pages[i]``, merged and cut as negotiated."""
    d = build_descriptors(src_geometry, src_pages, dst_geometry, dst_pages)  # type: ignore[arg-type]
    if merge:
        d = coalesce(d)
    if split_bytes > 0:
        d = split(d, split_bytes)
    crc = zlib.crc32(np.ascontiguousarray(d.length, dtype="<i8").tobytes())
    crc = zlib.crc32(np.ascontiguousarray(d.src, dtype="<i8").tobytes(), crc)
    crc = zlib.crc32(np.ascontiguousarray(d.dst, dtype="<i8").tobytes(), crc)
    return WirePlan(d, crc)


def page_outcome(d: Descriptors, failed: np.ndarray, n_pages: int) -> np.ndarray:
    """Per page: True when no descriptor whose page range covers it failed.

    ``failed`` is a bool mask over descriptors. A merged descriptor covers the hull of its
    members' pages, so its failure fails all of them (never counts a partial page).
    """
    ok = np.ones(n_pages, dtype=bool)
    if n_pages == 0 or not failed.any():
        return ok
    marks = np.zeros(n_pages + 1, dtype=np.int64)
    np.add.at(marks, d.page[failed], 1)
    np.add.at(marks, d.page_end[failed], -1)
    ok &= np.cumsum(marks[:-1]) == 0
    return ok
