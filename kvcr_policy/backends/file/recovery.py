"""Recovery on open: what a pool's directory still holds, checked before anything is served.

Every record of the index is decoded (:mod:`.records`); one that is damaged (torn, copied,
for another page size) is dropped, as is a live record whose slot lies past the slot file's
end or past the tier's capacity, and every record of a key but the newest (a key written
again lands in another slot). With ``check = "pages"`` each remaining page is also read back
and its CRC-32C compared (the whole tier is read once); with ``"records"`` only the records
are checked on open, and a page's CRC is checked on every read anyway. Whatever is dropped
is a miss, never wrong bytes: its record is rewritten as a tombstone before the tier opens.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .directory import TierFiles
from .engine import IOEngine, plan_runs
from .reads import ReadRequest
from .records import RECORD_BYTES, Damage, Record, decode

__all__ = ["Check", "Recovered", "recover"]

Check = Literal["records", "pages"]
#: Records read per pread on open (about 4.5 MB).
_CHUNK = 4096


@dataclass(frozen=True, slots=True)
class Recovered:
    """The live records kept (oldest write first), and what was dropped and why."""

    records: list[Record]
    dropped: list[int] = field(default_factory=list)
    reasons: dict[str, int] = field(default_factory=dict)


def _scan(files: TierFiles) -> tuple[list[Record], list[int], Counter[str]]:
    size = os.fstat(files.index).st_size // RECORD_BYTES
    records: list[Record] = []
    dropped: list[int] = []
    reasons: Counter[str] = Counter()
    for start in range(0, size, _CHUNK):
        count = min(_CHUNK, size - start)
        raw = os.pread(files.index, count * RECORD_BYTES, start * RECORD_BYTES)
        rows = np.frombuffer(raw, dtype=np.uint8)[: count * RECORD_BYTES].reshape(-1, RECORD_BYTES)
        for row in np.flatnonzero(rows.any(axis=1)).tolist():  # never-written records are zeros
            slot = start + row
            got = decode(rows[row].tobytes(), slot, files.page_bytes)
            if isinstance(got, Damage):
                dropped.append(slot)
                reasons[got.name.lower()] += 1
            elif got is None:
                continue
            else:
                records.append(got)
    return records, dropped, reasons


def recover(files: TierFiles, capacity: int, check: Check, engine: IOEngine) -> Recovered:
    """Read ``files``' index for a tier of ``capacity`` slots; see the module docstring."""
    found, dropped, reasons = _scan(files)
    data_slots = os.fstat(files.data).st_size // files.stride
    newest: dict[str, Record] = {}
    for record in found:
        if record.slot >= min(capacity, data_slots):
            dropped.append(record.slot)
            reasons["past_end"] += 1
            continue
        other = newest.get(record.key)
        if other is not None:
            older = other if other.seq < record.seq else record
            dropped.append(older.slot)
            reasons["superseded"] += 1
            if older is record:
                continue
        newest[record.key] = record
    kept = sorted(newest.values(), key=lambda r: r.seq)
    if check == "pages" and kept:
        kept = _check_pages(files, kept, engine, dropped, reasons)
    return Recovered(kept, sorted(dropped), dict(reasons))


def _check_pages(
    files: TierFiles,
    kept: list[Record],
    engine: IOEngine,
    dropped: list[int],
    reasons: Counter[str],
) -> list[Record]:
    slots = np.array([r.slot for r in kept], dtype=np.int64)
    crcs = np.array([r.page_crc for r in kept], dtype=np.uint32)
    good = np.zeros(len(kept), dtype=bool)
    runs = plan_runs(slots, engine.per_run(files.stride))
    futures = [
        (
            run,
            engine.read(ReadRequest(files, None, int(slots[run[0]]), run, crcs[run])),
        )
        for run in runs
    ]
    for run, future in futures:
        good[run] = future.result()
    for record, ok in zip(kept, good.tolist(), strict=True):
        if not ok:
            dropped.append(record.slot)
            reasons["page_crc"] += 1
    return [record for record, ok in zip(kept, good.tolist(), strict=True) if ok]
