"""The KVCR calls of one staged batch (:mod:`.staging`), two in flight so copies overlap them.

A batch moves in parts of at most half its pool's usable staging slots (:data:`PARTS`): while
KVCR delivers one part into its slots, the part before is scattered into the pool (a store:
the next part is gathered while KVCR copies the one before). A part takes all its slots at once
and waits for them only while it holds none, so batches in flight never deadlock over slots; a
part's slots go back as soon as its bytes are in the pool (restore) or in KVCR (store).
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .runner import Entries, Runner
from .staging import Staging

__all__ = ["PARTS", "Batch", "move"]

#: A part is at most this fraction of the usable slots: one in flight while one is copied.
PARTS = 2


class StagedPool(Protocol):
    """What a staged batch uses of its pool (:class:`~.pool.KvcrPool`)."""

    @property
    def staging(self) -> Staging | None: ...

    @property
    def runner(self) -> Runner: ...


class Batch(Protocol):
    """What a staged batch uses of its transfer (:class:`~.transfer.KvcrTransfer`, which
    imports this module: the protocol keeps the two apart)."""

    @property
    def read(self) -> bool: ...

    @property
    def pool(self) -> StagedPool: ...

    @property
    def pages(self) -> np.ndarray: ...

    @property
    def blocks(self) -> list[bytes]: ...

    def claim_late(self, positions: np.ndarray) -> list[Any]: ...

    def ok(self, entries: Entries, position: int) -> bool: ...

    def check(self, positions: np.ndarray, entries: Entries) -> None: ...


@dataclass
class _Part:
    positions: list[int]
    pages: list[int]
    slots: list[int]
    late: list[Any] = field(default_factory=list)
    future: Future[Entries] | None = None


def _start(t: Batch, part: np.ndarray, slots: list[int]) -> _Part:
    """Claim (restore) or gather (store) the part, and start its one KVCR call."""
    staging, runner = t.pool.staging, t.pool.runner
    assert staging is not None  # only a staged pool's batches come here
    call = _Part(part.tolist(), t.pages[part].tolist(), slots)
    try:
        if t.read:
            call.late = t.claim_late(part)
        else:
            staging.pages.gather(staging.area, slots, call.pages)
        rows = zip(call.positions, slots, strict=True)
        blocks = {t.blocks[p]: [staging.refs[s]] for p, s in rows}
        method = runner.kvcr.deliver if t.read else runner.kvcr.deposit
        call.future = runner.start("deliver" if t.read else "deposit", method, blocks)
    except BaseException:
        runner.release(call.late)
        staging.area.give(slots)
        raise
    return call


def _finish(t: Batch, call: _Part) -> Entries:
    """Wait for the part's call, release its claims, scatter what arrived, give its slots back
    (retired instead when KVCR never reported the call done: it may still write them)."""
    staging, runner = t.pool.staging, t.pool.runner
    assert staging is not None and call.future is not None
    retire = True
    try:
        entries = call.future.result()
        retire = False
        runner.release(call.late)  # delivered: DRAM may take others
        call.late = []
        if t.read:
            arrived = [t.ok(entries, p) for p in call.positions]
            staging.pages.scatter(staging.area, call.slots, call.pages, arrived)
        return entries
    finally:
        runner.release(call.late)
        staging.area.give(call.slots, retire=retire)


def move(t: Batch, positions: np.ndarray) -> np.ndarray:
    """Move a batch's pages; raise when any did not move (the fallback then submits them again
    one by one)."""
    staging = t.pool.staging
    assert staging is not None
    area = staging.area
    step = max(1, area.usable() // PARTS)
    pending: _Part | None = None
    try:
        for start in range(0, len(positions), step):
            part = positions[start : start + step]
            slots = area.take(len(part), wait=pending is None)
            if slots is None:  # none free while this batch holds some: finish its own first
                done, pending = pending, None
                assert done is not None
                t.check(np.asarray(done.positions), _finish(t, done))
                slots = area.take(len(part), wait=True)
                assert slots is not None
            call = _start(t, part, slots)
            done, pending = pending, call
            if done is not None:
                t.check(np.asarray(done.positions), _finish(t, done))
        if pending is not None:
            done, pending = pending, None
            t.check(np.asarray(done.positions), _finish(t, done))
    finally:
        if pending is not None:  # an error: the call in flight still gives its slots back
            with contextlib.suppress(Exception):  # the error under way is the one raised
                _finish(t, pending)
    return np.ones(len(positions), dtype=bool)
