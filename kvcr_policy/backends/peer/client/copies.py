"""Reads, writes and the probe of a shared-memory connection (worker thread, copies off it).

The tier is mapped here (:mod:`.shared`), so pages move by memory copy, on the connection's
copier (the host copy engine of ``dram``: several threads, the GIL released), while claims and
reservations stay on the server, as over UCX:

- a read: CLAIM -> the claimed slots -> plain descriptors shaped and checked as in
  :mod:`.ops` -> a copy from the mapped tier into the pool -> COPIED -> SENT. The pages count
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
from typing import Any

import numpy as np

from kvcr_policy.descriptors import Descriptors, build_descriptors
from kvcr_policy.errors import KVCRPolicyError, PoolError, TransportError

from ...base import Shape
from ...dram.transports.base import CopyBatch
from ..wire import messages as m
from ..wire.coverage import Cover
from .connection import Connection
from .ops import NO_KEEP, Done, Keep, Target, check_slots, error_of, guard, shaped

__all__ = ["probe", "read", "write"]


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


def read(
    conn: Connection,
    target: Target,
    keys: list[str],
    pages: np.ndarray,
    shape: Shape,
    done: Done,
) -> None:
    """Restore ``keys`` into pool ``pages``; ``done(ok per key)`` (False past the claimed run,
    and for every page of a claim the server no longer held when the copy ended)."""
    n = len(keys)
    tier, pool = target.endpoints()

    def claimed(reply: Any) -> None:
        error = error_of(reply, "CLAIM")
        if error is not None:
            done(error)
            return
        slots = check_slots(target, reply.slots, n)
        count = len(slots)
        if count == 0:
            done(np.zeros(n, dtype=bool))
            return
        what = f"reading {count} pages into pool {target.geometry.name!r}"
        try:
            plain = build_descriptors(target.tier, slots, target.geometry, pages[:count])
            cover = Cover.of_moves(target.tier, slots, target.geometry, pages[:count])
            d: Descriptors = shaped(shape, plain, cover, what)
        except KVCRPolicyError as err:
            conn.notify(m.Release(reply.claim))
            done(err)
            return

        def copied(err: BaseException | None) -> None:
            if err is not None:
                conn.notify(m.Release(reply.claim))
                done(_failed(what, err))
                return

            def answered(answer: Any) -> None:
                problem = error_of(answer, "COPIED")
                if problem is not None:
                    done(problem)
                    return
                ok = np.zeros(n, dtype=bool)
                ok[:count] = bool(answer.ok)  # a claim let go: every page of it is missed
                done(ok)

            conn.request(m.Copied(reply.claim), answered)

        _copy(conn, CopyBatch(tier, pool, d), copied)

    conn.request(m.Claim(target.number, keys, pages), guard(conn, done, "CLAIMED", claimed))


def write(
    conn: Connection,
    target: Target,
    keys: list[str],
    pages: np.ndarray,
    shape: Shape,
    done: Done,
    keep: Keep = NO_KEEP,
) -> None:
    """Store pool ``pages`` under ``keys``; ``done(ok per key)`` (True also where present).
    ``keep``: the call's number and its other keys, whose present pages no batch of the call
    may evict (see :class:`~..wire.messages.Reserve`)."""
    n = len(keys)
    tier, pool = target.endpoints()

    def written(answer: Any) -> None:
        error = error_of(answer, "COMMIT")
        if error is not None:
            done(error)
            return
        covered = min(n, len(answer.ok))
        ok = np.zeros(n, dtype=bool)
        ok[:covered] = answer.ok[:covered]
        done(ok)

    def reserved(reply: Any) -> None:
        error = error_of(reply, "RESERVE")
        if error is not None:
            done(error)
            return
        slots = reply.slots
        covered = len(slots)
        if covered > n:
            raise TransportError(f"the peer reserved {covered} slots for {n} keys")
        todo = np.flatnonzero(slots >= 0)
        check_slots(target, slots[todo], n)
        flags = np.zeros(covered, dtype=bool)
        if len(todo) == 0:
            conn.request(m.Commit(reply.reservation, flags), written)
            return
        sources = pages[:covered][todo]
        what = f"writing {len(todo)} pages of pool {target.geometry.name!r}"
        try:
            plain = build_descriptors(target.geometry, sources, target.tier, slots[todo])
            cover = Cover.of_moves(target.geometry, sources, target.tier, slots[todo])
            d: Descriptors = shaped(shape, plain, cover, what)
        except KVCRPolicyError as err:
            conn.notify(m.Release(reply.reservation))
            done(err)
            return

        def copied(err: BaseException | None) -> None:
            # A failed copy stopped where it failed: nothing of it is committed.
            flags[todo] = err is None
            conn.request(m.Commit(reply.reservation, flags), written)

        _copy(conn, CopyBatch(pool, tier, d), copied)

    reserve = m.Reserve(target.number, keys, pages, keep[0], list(keep[1]))
    conn.request(reserve, guard(conn, done, "RESERVED", reserved))


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
