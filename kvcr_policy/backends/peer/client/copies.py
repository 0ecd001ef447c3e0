"""Reads, writes and the probe of a shared-memory connection (worker thread, copies off it).

The tier is mapped here (:mod:`.shared`), so pages move by memory copy, on the connection's
copier (the host copy engine of ``dram``: several threads, the GIL released), while claims and
reservations stay on the server, as over UCX:

- a read: CLAIM -> the claimed slots -> plain descriptors shaped and checked
  (:mod:`.steps`) -> a copy from the mapped tier into the pool -> COPIED -> SENT. The pages count
  only when SENT says the claim was still held when the copy ended: a claim the server let go
  (it expired on a stalled client, or the session ended) may have been overwritten while it
  was copied, so those pages are missed, never used.
- a write: RESERVE -> the reserved slots -> a copy from the pool into them -> COMMIT of what
  was copied -> WRITTEN. A reservation this side never commits (the process died, or the
  session ended mid-copy) stays out of use on the server until this process has exited
  (:mod:`kvcr_policy.backends.peer.server.quarantine`).

Each finished copy comes back to the worker thread (:meth:`Loop.call`) before anything is sent.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from kvcr_policy.descriptors import Descriptors
from kvcr_policy.errors import PoolError, TransportError

from ...dram.transports.base import CopyBatch
from ..wire import messages as m
from ..wire.coverage import Cover
from .connection import Connection
from .steps import Batch, Done, Move, answered
from .target import Target

__all__ = ["copy_in", "copy_out", "probe"]


def _copy(
    conn: Connection,
    batch: CopyBatch,
    then: Callable[[BaseException | None], None],
) -> None:
    """Copy ``batch`` on the connection's copier; ``then(error or None)`` on the worker."""
    future: Future[None] = conn.copier.submit(batch)

    def back(done: Future[None]) -> None:
        conn.copies += 1
        then(done.exception())

    future.add_done_callback(lambda done: conn.worker.call(back, done))


def _failed(what: str, err: BaseException) -> TransportError:
    return TransportError(f"{what}: the copy failed: {type(err).__name__}: {err}")


def copy_in(b: Batch) -> Move:
    """A read's move: a copy from the mapped tier into the pool, then COPIED asks whether the
    claim was still held (a claim let go: every page of it is missed)."""
    conn = b.conn
    tier, pool = b.target.endpoints()

    def move(held: int, d: Descriptors, cover: Cover, what: str, finish: Done) -> None:
        def copied(err: BaseException | None) -> None:
            if err is not None:
                conn.notify(m.Release(held))
                finish(_failed(what, err))
                return
            conn.request(m.Copied(held), answered(finish, "COPIED", lambda a: finish(bool(a.ok))))

        _copy(conn, CopyBatch(tier, pool, d), copied)

    return move


def copy_out(b: Batch) -> Move:
    """A write's move: a copy from the pool into the reserved slots (a failed copy stopped
    where it failed: nothing of it is committed)."""
    conn = b.conn
    tier, pool = b.target.endpoints()

    def move(held: int, d: Descriptors, cover: Cover, what: str, finish: Done) -> None:
        _copy(conn, CopyBatch(pool, tier, d), lambda err: finish(err is None))

    return move


def probe(conn: Connection, target: Target, nbytes: int, done: Done) -> None:
    """One copy of ``nbytes`` from the mapped tier into the pool's first bytes (a limit)."""
    tier, pool = target.endpoints()
    if nbytes > min(tier.nbytes, pool.nbytes):
        done(PoolError(f"probe of {nbytes} bytes does not fit the pool and the tier"))
        return
    one = Descriptors.from_arrays([0], [0], [nbytes])

    def copied(err: BaseException | None) -> None:
        done(_failed("probe", err) if err is not None else True)

    _copy(conn, CopyBatch(tier, pool, one), copied)
