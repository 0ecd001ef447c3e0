"""The durable index of one ``file`` tier: commit records on disk, and what they say in memory.

Per slot of the slot file it knows whether the on-disk record is live and the page's CRC-32C
(what a read checks). Every change follows the write order that makes a crash harmless:

- :meth:`SlotIndex.retire` turns the records of slots about to be overwritten (or of deleted
  keys) into tombstones, durable before any byte of the slot changes (``sync = "batch"``);
- :meth:`SlotIndex.publish` makes the pages' bytes durable, then writes their records, then
  makes those durable; only then may the store report the keys present.

``sync = "none"`` issues the same writes in the same order without ``fdatasync(2)``: that
survives the process being killed at any point (the page cache keeps every completed write),
not a power loss, after which the records' and pages' CRCs still keep damaged pages out.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np

from .directory import TierFiles
from .records import RECORD_BYTES, Record, encode, tombstone

__all__ = ["SlotIndex", "Sync"]

Sync = Literal["batch", "none"]
#: Records per pwritev(2): well under IOV_MAX (1024 on Linux, <limits.h>).
_IOV = 512


def _write(fd: int, items: Sequence[tuple[int, bytes]]) -> None:
    """Write records ``(slot, bytes)``: one pwritev per run of consecutive slots."""
    ordered = sorted(items)
    start = 0
    while start < len(ordered):
        end = start + 1
        while (
            end < len(ordered) and end - start < _IOV and ordered[end][0] == ordered[end - 1][0] + 1
        ):
            end += 1
        chunk = [data for _, data in ordered[start:end]]
        os.pwritev(fd, chunk, ordered[start][0] * RECORD_BYTES)
        start = end


class SlotIndex:
    """The records of a tier of ``capacity`` slots; see the module docstring. Callers hold the
    tier's record lock around every method that writes."""

    def __init__(self, files: TierFiles, capacity: int, sync: Sync) -> None:
        self.files = files
        self.capacity = capacity
        self.sync = sync == "batch"
        self.live = np.zeros(capacity, dtype=bool)
        self.crc = np.zeros(capacity, dtype=np.uint32)
        self.seq = 0
        #: fdatasync(2) calls made, for stats.
        self.syncs = 0

    def load(self, records: Iterable[Record]) -> None:
        """What recovery kept (the files already hold it)."""
        for record in records:
            self.live[record.slot] = True
            self.crc[record.slot] = record.page_crc
            self.seq = max(self.seq, record.seq)

    def _sync(self, fd: int) -> None:
        if self.sync:
            os.fdatasync(fd)
            self.syncs += 1

    def retire(self, slots: Iterable[int], force: bool = False) -> int:
        """Tombstone the live records of ``slots`` (all given, with ``force``: recovery's
        damaged ones), durable before returning. Returns how many were written."""
        chosen = [int(s) for s in slots if force or self.live[s]]
        if not chosen:
            return 0
        _write(self.files.index, [(slot, tombstone(slot)) for slot in chosen])
        self._sync(self.files.index)
        self.live[chosen] = False
        return len(chosen)

    def publish(self, slots: Sequence[int], keys: Sequence[str], crcs: Sequence[int]) -> None:
        """Make the pages in ``slots`` durable, then their records, in that order."""
        if not slots:
            return
        self._sync(self.files.data)
        items = []
        for slot, key, crc in zip(slots, keys, crcs, strict=True):
            self.seq += 1
            items.append((slot, encode(Record(slot, key, crc, self.seq), self.files.page_bytes)))
        _write(self.files.index, items)
        self._sync(self.files.index)
        self.live[list(slots)] = True
        self.crc[list(slots)] = crcs

    def clear(self) -> None:
        """Every record free (the index zeroed), durable."""
        os.ftruncate(self.files.index, 0)
        os.ftruncate(self.files.index, self.capacity * RECORD_BYTES)
        self._sync(self.files.index)
        self.live[:] = False
