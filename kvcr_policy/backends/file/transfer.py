"""One get or set on one ``file`` tier: the claim or reservation it holds, its runs of I/O,
and (for a set) the commit that makes the pages durable before the store reports them.

A read claims the leading present run (the claimed slots cannot be overwritten until it
ends); a page whose bytes fail their CRC is not moved and its key is dropped, so it misses from
then on. A write reserves slots, tombstones the records of slots it reuses, writes the pages,
then :meth:`FileWrite.finish` publishes exactly the pages written (:mod:`.index`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np

from .engine import PoolSide, plan_runs
from .reads import ReadRequest
from .tier import FileTier

__all__ = ["FileRead", "FileWrite"]

log = logging.getLogger("kvcr_policy.backends.file")


def _gather(
    parts: list[tuple[np.ndarray, Future[np.ndarray]]], count: int, settle: Any = None
) -> Future[np.ndarray]:
    """One future of ``count`` results from the runs' futures (rows of each run's result)."""
    done: Future[np.ndarray] = Future()
    results = np.zeros(count, dtype=bool)
    left = [len(parts)]
    lock = threading.Lock()
    if not parts:
        done.set_result(results)
        return done

    def one(rows: np.ndarray, future: Future[np.ndarray]) -> None:
        error = future.exception()
        if error is not None:  # its pages are not moved: the call reports them missing
            log.warning("file tier: a run of %d pages failed: %s", len(rows), error)
        else:
            value = future.result()
            if settle is not None:
                value = settle(rows, value)
            results[rows] = value
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            done.set_result(results)

    for rows, future in parts:
        future.add_done_callback(functools.partial(one, rows))
    return done


class _Base:
    def __init__(self, tier: FileTier, side: PoolSide, keys: list[str], pages: np.ndarray) -> None:
        self.tier, self.side, self.keys, self.pages = tier, side, keys, pages
        self.started = time.perf_counter()

    def _count(self, moved: np.ndarray, read: bool) -> None:
        seconds = time.perf_counter() - self.started
        self.tier.moved.add(read, int(np.count_nonzero(moved)), seconds)

    def submit(self, positions: np.ndarray, shape: Any) -> Future[np.ndarray]:
        raise NotImplementedError


class FileRead(_Base):
    """One get: the claimed run's pages read, checked and copied into the pool."""

    needs = None

    def __init__(self, tier: FileTier, side: PoolSide, keys: list[str], pages: np.ndarray) -> None:
        super().__init__(tier, side, keys, pages)
        self.claim = tier.store.claim(keys, distinct=True)  # distinct (backends.base)
        self.limit = len(self.claim.slots)
        self.miss = "evicted" if self.claim.evicted else "absent"
        self.fslots = tier.fmap[self.claim.slots]
        self.damaged: list[int] = []

    def submit(self, positions: np.ndarray, shape: Any) -> Future[np.ndarray]:
        tier, files = self.tier, self.tier.files
        fslots = self.fslots[positions]
        parts = []
        for run in plan_runs(fslots, tier.engine.per_run(files.stride, len(fslots))):
            first = int(fslots[run[0]])
            request = ReadRequest(
                files,
                self.side,
                first,
                self.pages[positions[run]],
                tier.index.crc[fslots[run]],
                tier.read_paths,
            )
            future = tier.engine.read(request)
            parts.append((run, future))

        def settle(rows: np.ndarray, ok: np.ndarray) -> np.ndarray:
            self.damaged.extend(positions[rows[~ok]].tolist())
            return ok

        return _gather(parts, len(positions), settle)

    def finish(self, moved: np.ndarray) -> list[bool]:
        self.tier.store.release(self.claim)
        if self.damaged:
            self.tier.damaged_reads += len(self.damaged)
            self.tier.drop([self.keys[p] for p in self.damaged])
        self._count(moved, read=True)
        result = [False] * len(self.keys)
        result[: self.limit] = moved.tolist()
        return result

    def abort(self) -> None:
        self.tier.store.release(self.claim)


class FileWrite(_Base):
    """One set: reserved slots, their old records retired, pages written, then published."""

    miss = "claimed"  # keys past limit: every slot held by transfers in flight

    def __init__(self, tier: FileTier, side: PoolSide, keys: list[str], pages: np.ndarray) -> None:
        super().__init__(tier, side, keys, pages)
        with tier.lock:
            self.reservation = tier.store.reserve(keys)
            slots = self.reservation.slots
            self.needs = slots >= 0
            self.fslots = np.where(self.needs, tier.fmap[np.maximum(slots, 0)], -1)
            try:
                tier.index.retire(self.fslots[self.needs].tolist())
            except BaseException:
                tier.store.abort(self.reservation)
                raise
        self.limit = len(self.reservation.keys)
        self.crcs = np.zeros(self.limit, dtype=np.uint32)
        self.written = np.zeros(self.limit, dtype=bool)

    def submit(self, positions: np.ndarray, shape: Any) -> Future[np.ndarray]:
        tier, files = self.tier, self.tier.files
        fslots = self.fslots[positions]
        parts = []
        for run in plan_runs(fslots, tier.engine.per_run(files.stride, len(fslots))):
            first = int(fslots[run[0]])
            pages = self.pages[positions[run]]
            future = tier.engine.write(files, self.side, first, pages, tier.index.sync)
            parts.append((run, future))

        def settle(rows: np.ndarray, crcs: np.ndarray) -> np.ndarray:
            self.crcs[positions[rows]] = crcs
            self.written[positions[rows]] = True
            return np.ones(len(rows), dtype=bool)

        return _gather(parts, len(positions), settle)

    def finish(self, moved: np.ndarray) -> list[bool]:
        tier, reservation = self.tier, self.reservation
        ok = moved[: self.limit] & self.needs & self.written
        chosen = np.flatnonzero(ok)
        keys = [self.keys[p] for p in chosen.tolist()]
        with tier.lock:
            try:
                tier.index.publish(self.fslots[chosen].tolist(), keys, self.crcs[chosen].tolist())
            except BaseException:
                tier.store.abort(reservation)
                raise
            tier.store.commit(reservation, ok.tolist())
            # A key deleted or cleared while it was written is not published: its record goes.
            now = tier.store.lookup(keys)
            lost = now != reservation.slots[chosen]
            if lost.any():
                tier.index.retire(self.fslots[chosen[lost]].tolist())
            tier.after_commit()
        self._count(ok, read=False)
        result = [False] * len(self.keys)
        for i in range(self.limit):  # the keys are distinct (backends.base)
            result[i] = bool(ok[i]) or reservation.present[i]
        return result

    def abort(self) -> None:
        self.tier.store.abort(self.reservation)
