"""The steps a batch takes with the server, whichever way its bytes move (worker thread).

A read: CLAIM -> the server's slots, checked -> the plain descriptors (tier -> pool), shaped
by ``shape`` and checked -> the bytes move (:mod:`.ops` over UCX, :mod:`.copies` by memory
copy) -> the outcome of the claimed run. A write: RESERVE -> the reserved slots, checked ->
the shaped descriptors (pool -> tier) -> the bytes move -> COMMIT of what moved -> WRITTEN.
A batch whose descriptors are refused releases its claim or reservation before anything moves.

``shape`` (:data:`kvcr_policy.backends.base.Shape`) gets the plain descriptors of the batch
(:func:`~kvcr_policy.descriptors.build_descriptors`) and returns those to move: any merge and
cut of them (:meth:`~..wire.coverage.Cover.check` refuses anything else before a byte moves).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcr_policy.descriptors import Descriptors, build_descriptors
from kvcr_policy.errors import (
    AuthenticationError,
    CapacityError,
    KVCRPolicyError,
    PoolError,
    TransportError,
    UnsupportedError,
)
from kvcr_policy.geometry import PoolGeometry

from ...base import Shape
from ..wire import messages as m
from ..wire.coverage import Cover
from ..wire.payload import MAX_DESCRIPTORS
from .connection import Connection
from .target import Target

__all__ = [
    "NO_KEEP",
    "Batch",
    "Done",
    "Keep",
    "Move",
    "answered",
    "check_slots",
    "claim",
    "error_of",
    "guard",
    "reserve",
    "shaped",
]

#: A write's call: its number (0: none) and the keys the peer is asked to keep for it.
Keep = tuple[int, Sequence[str]]
NO_KEEP: Keep = (0, ())

#: ``done(result)``: a bool array per requested page, or an exception.
Done = Callable[[Any], None]
#: How a batch's bytes move: ``move(claim or reservation, descriptors, cover, what, finish)``;
#: ``finish`` takes an exception (the batch fails with it, nothing is committed) or the
#: outcome of the moved pages (a bool, or a bool per page).
Move = Callable[[int, Descriptors, Cover, str, Done], None]
#: Source offsets above this are refused before the shift is computed (no int64 overflow).
_HUGE = 1 << 62


#: An ERROR message's code -> the error it stands for (any other code: TransportError).
_REFUSALS: dict[int, type[KVCRPolicyError]] = {
    m.Err.CAPACITY: CapacityError,
    m.Err.UNSUPPORTED: UnsupportedError,
    m.Err.BAD_REQUEST: PoolError,
    m.Err.AUTH: AuthenticationError,
}


def error_of(reply: Any, what: str) -> Exception | None:
    """The exception a reply stands for (an ERROR message or a TransportError), else None."""
    if isinstance(reply, Exception):
        return reply
    if isinstance(reply, m.Error):
        return _REFUSALS.get(reply.code, TransportError)(f"{what}: the peer refused: {reply.text}")
    return None


def check_slots(target: Target, slots: np.ndarray, limit: int) -> np.ndarray:
    """Server-sent slots, refused (connection failed) unless they fit what we asked for."""
    bad = len(slots) > limit or (
        len(slots) and (slots.min() < 0 or slots.max() >= target.tier.pages)
    )
    if bad:
        raise TransportError(f"the peer answered {len(slots)} slots out of range or over {limit}")
    return slots


def guard(
    conn: Connection, done: Done, what: str, fn: Callable[[Any], None]
) -> Callable[[Any], None]:
    """``fn`` as a reply callback; if it raises before posting, the op fails and so does the
    connection (the server holds a claim or posted receives that only its end releases)."""

    def run(reply: Any) -> None:
        try:
            fn(reply)
        except Exception as err:
            done(err)
            conn.fail(f"{what}: {err}")

    return run


def shaped(shape: Shape, plain: Descriptors, cover: Cover, what: str) -> Descriptors:
    """What ``shape`` makes of ``plain``, checked against ``cover`` (TransportError: nothing
    moves; a strategy's bug fails the batch, never the connection)."""
    for array in (plain.src, plain.dst, plain.length):
        array.flags.writeable = False  # so that ``plain`` returned as is needs no check
    try:
        shaped = shape(plain)
    except KVCRPolicyError:
        raise
    except Exception as err:
        message = f"{what}: the coalescing strategy failed: {type(err).__name__}: {err}"
        raise TransportError(message) from err
    if not isinstance(shaped, Descriptors):
        got = type(shaped).__name__
        message = f"{what}: expected Descriptors from the coalescing strategy, got {got}"
        raise TransportError(message)
    if len(shaped) > MAX_DESCRIPTORS:
        message = (
            f"{what}: the coalescing strategy returned {len(shaped)} descriptors for one batch; "
            f"one request carries at most {MAX_DESCRIPTORS}: cut fewer pieces or lower "
            "batching.read_batch_pages"
        )
        raise TransportError(message)
    if shaped is not plain:
        src = shaped.src
        if len(src) and (int(src.min()) < 0 or int(src.max()) > _HUGE):
            raise TransportError(f"{what}: a descriptor's source offset is out of range")
        what += " (descriptors from the coalescing strategy)"
        cover.check(shaped.dst, shaped.length, src - shaped.dst, what=what, error=TransportError)
    return shaped


def _moves(
    conn: Connection,
    held: int,
    shape: Shape,
    what: str,
    sides: tuple[PoolGeometry, np.ndarray, PoolGeometry, np.ndarray],
    done: Done,
) -> tuple[Descriptors, Cover] | None:
    """The shaped descriptors of ``src pages -> dst pages`` and their cover; None (``held``
    released, ``done`` told why) where they are refused."""
    try:
        plain = build_descriptors(*sides)
        cover = Cover.of_moves(*sides)
        return shaped(shape, plain, cover, what), cover
    except KVCRPolicyError as err:
        conn.notify(m.Release(held))
        done(err)
        return None


@dataclass(frozen=True, slots=True)
class Batch:
    """One batch of a call on one connection: its pool, keys and pages, how its descriptors
    are shaped, and ``done`` (a bool per key, or an exception)."""

    conn: Connection
    target: Target
    keys: list[str]
    pages: np.ndarray
    shape: Shape
    done: Done


def answered(done: Done, what: str, fn: Callable[[Any], None]) -> Callable[[Any], None]:
    """``fn`` as a reply callback; a reply that stands for an error (:func:`error_of`) goes to
    ``done`` instead."""

    def run(reply: Any) -> None:
        error = error_of(reply, what)
        if error is not None:
            done(error)
            return
        fn(reply)

    return run


def claim(b: Batch, move: Move) -> None:
    """Claim ``b.keys`` and ``move`` their claimed run into pool ``b.pages``; ``b.done(ok per
    key)`` (False past the claimed run)."""
    conn, target, pages, done = b.conn, b.target, b.pages, b.done
    n = len(b.keys)

    def claimed(reply: Any) -> None:
        slots = check_slots(target, reply.slots, n)
        count = len(slots)
        if count == 0:
            done(np.zeros(n, dtype=bool))
            return
        what = f"reading {count} pages into pool {target.geometry.name!r}"
        sides = (target.tier, slots, target.geometry, pages[:count])
        moves = _moves(conn, reply.claim, b.shape, what, sides, done)
        if moves is None:
            return

        def finish(result: Any) -> None:
            if isinstance(result, BaseException):
                done(result)
                return
            ok = np.zeros(n, dtype=bool)
            ok[:count] = result
            done(ok)

        move(reply.claim, *moves, what, finish)

    request = m.Claim(target.number, b.keys, pages)
    conn.request(request, guard(conn, done, "CLAIMED", answered(done, "CLAIM", claimed)))


def reserve(b: Batch, keep: Keep, move: Move) -> None:
    """Reserve slots for ``b.keys``, ``move`` pool ``b.pages`` into them and commit what moved;
    ``b.done(ok per key)`` (True also where present). ``keep``: the call's number and its other
    keys, whose present pages no batch of the call may evict (see
    :class:`~..wire.messages.Reserve`)."""
    conn, target, pages, done = b.conn, b.target, b.pages, b.done
    n = len(b.keys)

    def committed(answer: Any) -> None:
        covered = min(n, len(answer.ok))
        ok = np.zeros(n, dtype=bool)
        ok[:covered] = answer.ok[:covered]
        done(ok)

    written = answered(done, "COMMIT", committed)

    def reserved(reply: Any) -> None:
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
        what = f"writing {len(todo)} pages of pool {target.geometry.name!r}"
        sides = (target.geometry, pages[:covered][todo], target.tier, slots[todo])
        moves = _moves(conn, reply.reservation, b.shape, what, sides, done)
        if moves is None:
            return

        def finish(result: Any) -> None:
            if isinstance(result, BaseException):  # the server let the reservation go
                done(result)
                return
            flags[todo] = result
            conn.request(m.Commit(reply.reservation, flags), written)

        move(reply.reservation, *moves, what, finish)

    request = m.Reserve(target.number, b.keys, pages, keep[0], list(keep[1]))
    conn.request(request, guard(conn, done, "RESERVED", answered(done, "RESERVE", reserved)))
