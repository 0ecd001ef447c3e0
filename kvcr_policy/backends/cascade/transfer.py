"""A get across the cascade's two levels: DRAM's keys from DRAM, the others from disk, then
the disk's hits promoted into DRAM (:meth:`.pool.CascadePool.promote`); and a set of more new
keys than DRAM holds: the leading ones to disk, the rest into DRAM (:class:`CascadeWrite`)."""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np

from .pool import CascadePool

__all__ = ["CascadeRead", "CascadeWrite"]


def _covered(subset: np.ndarray, limit: int, end: int) -> int:
    """Positions of the call covered from the start when a level claimed only ``limit`` of
    its ``subset``: up to the first it did not claim."""
    return int(subset[limit]) if limit < len(subset) else end


def _submit(levels: Any, local: np.ndarray, positions: np.ndarray, shape: Any
            ) -> Future[np.ndarray]:  # fmt: skip
    """Submit each level's share of ``positions`` (``levels``: its transfer and a mask of the
    call's positions it holds, ``local``: a position's place in its level's transfer); one
    future of every position's result."""
    done: Future[np.ndarray] = Future()
    result = np.zeros(len(positions), dtype=bool)
    parts = []
    for transfer, mine in levels:
        rows = np.flatnonzero(mine[positions])
        if len(rows):
            parts.append((rows, transfer.submit(local[positions[rows]], shape)))
    left, lock = [len(parts)], threading.Lock()
    if not parts:
        done.set_result(result)

    def settle(rows: np.ndarray, future: Future[np.ndarray]) -> None:
        error = future.exception()
        if error is not None and not done.done():
            done.set_exception(error)
            return
        if error is None:
            result[rows] = future.result()
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last and not done.done():
            done.set_result(result)

    for rows, future in parts:
        future.add_done_callback(functools.partial(settle, rows))
    return done


class CascadeWrite:
    """A set of more new keys than DRAM holds: its first ``split`` keys are written to disk
    (``head``), the rest into DRAM (``tail``), as if each had gone through DRAM in turn."""

    miss = "claimed"

    def __init__(self, pool: CascadePool, keys: list[str], pages: np.ndarray, split: int) -> None:
        self.pool, self.keys, self.split = pool, keys, split
        self.head = pool.back.write(keys[:split], pages[:split])
        try:
            pool.make_room(pool.new_keys(keys[split:]), keys[split:])
            self.tail = pool.front.write(keys[split:], pages[split:])
        except BaseException:
            self.head.abort()
            raise
        head, tail = self.head.limit, self.tail.limit
        self.limit = head if head < split else split + tail
        self.needs = np.zeros(len(keys), dtype=bool)
        self.needs[:head] = self.head.needs[:head]
        if head == split:
            self.needs[split : split + tail] = _needs(self.tail)[:tail]
        where = np.arange(len(keys))
        self.level = (where >= split).astype(np.int64)
        self.local = np.where(where >= split, where - split, where)

    def submit(self, positions: np.ndarray, shape: Any) -> Future[np.ndarray]:
        return _submit(((self.head, self.level == 0), (self.tail, self.level == 1)), self.local,
                       positions, shape)  # fmt: skip

    def finish(self, moved: np.ndarray) -> list[bool]:
        full = np.zeros(len(self.keys), dtype=bool)
        full[: len(moved)] = np.asarray(moved, dtype=bool)[: self.limit]
        split = self.split
        head = self.head.finish(full[:split][: self.head.limit])
        tail = self.tail.finish(full[split:][: self.tail.limit])
        self.pool.used(self.keys[split:])
        return [*head, *tail]

    def abort(self) -> None:
        self.head.abort()
        self.tail.abort()


def _needs(transfer: Any) -> np.ndarray:
    needs = transfer.needs
    return np.ones(transfer.limit, dtype=bool) if needs is None else np.asarray(needs)


class CascadeRead:
    """One get: the leading run present on either level, each level's part claimed there."""

    needs = None
    miss = "absent"

    def __init__(self, pool: CascadePool, keys: list[str], pages: np.ndarray) -> None:
        self.pool, self.keys, self.pages = pool, keys, pages
        self.started = time.perf_counter()
        front, back = pool.where(keys)
        misses = np.flatnonzero(~(front | back))
        run = int(misses[0]) if len(misses) else len(keys)
        self.on_front = np.flatnonzero(front[:run])
        self.on_back = np.flatnonzero(back[:run])
        self.front = pool.front.read([keys[i] for i in self.on_front], pages[self.on_front])
        try:
            self.back = pool.back.read([keys[i] for i in self.on_back], pages[self.on_back])
        except BaseException:
            self.front.abort()
            raise
        self.limit = min(_covered(self.on_front, self.front.limit, run),
                         _covered(self.on_back, self.back.limit, run))  # fmt: skip
        # Where each position of the call is within its level's transfer.
        self.level = np.full(len(keys), -1, dtype=np.int64)
        self.local = np.zeros(len(keys), dtype=np.int64)
        self.level[self.on_front], self.local[self.on_front] = 0, np.arange(len(self.on_front))
        self.level[self.on_back], self.local[self.on_back] = 1, np.arange(len(self.on_back))

    def submit(self, positions: np.ndarray, shape: Any) -> Future[np.ndarray]:
        return _submit(((self.front, self.level == 0), (self.back, self.level == 1)), self.local,
                       positions, shape)  # fmt: skip

    def finish(self, moved: np.ndarray) -> list[bool]:
        moved = np.asarray(moved, dtype=bool)
        full = np.zeros(len(self.keys), dtype=bool)
        full[: len(moved)] = moved
        front = self.front.finish(full[self.on_front][: self.front.limit])
        back = self.back.finish(full[self.on_back][: self.back.limit])
        result = [False] * len(self.keys)
        for i, ok in zip(self.on_front.tolist(), front, strict=False):
            result[i] = ok and i < self.limit
        for i, ok in zip(self.on_back.tolist(), back, strict=False):
            result[i] = ok and i < self.limit
        hits = [self.keys[i] for i in self.on_front.tolist() if result[i]]
        self.pool.used(hits)
        promoted = [i for i in self.on_back.tolist() if result[i]]
        self.pool.read_from_dram(len(hits), time.perf_counter() - self.started)
        with self.pool.lock:
            self.pool.counts["file_hits"] += len(promoted)
        self.pool.promote([self.keys[i] for i in promoted], self.pages[promoted])
        return result

    def abort(self) -> None:
        self.front.abort()
        self.back.abort()
