"""Client-side transfers on a connection (worker thread): read, write, probe.

A read: CLAIM -> the server's slots -> the plain descriptors, shaped by ``shape`` and checked
-> one receive per descriptor posted straight into pool memory -> SEND names each descriptor's
tier bytes -> the server checks them against its claim and sends -> per-page outcome. A write:
RESERVE -> the reserved slots -> shaped descriptors -> POST names their tier bytes -> the server
checks them and posts receives into the slots -> POSTED -> sends straight from pool memory ->
COMMIT what was sent -> WRITTEN.

``shape`` (:data:`kvcr_policy.backends.base.Shape`) gets the plain descriptors of the batch
(:func:`~kvcr_policy.descriptors.build_descriptors`, tier -> pool for a read, pool -> tier for
a write) and returns those to move: any merge and cut of them
(:meth:`~..wire.coverage.Cover.check` refuses anything else before a byte moves). Descriptor
``i`` is UCX message ``tag_base + i``. A page counts only if every message that touched its
bytes completed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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

from ...base import Endpoint, Shape
from ..requests import message_limit
from ..wire import messages as m
from ..wire.coverage import Cover
from ..wire.payload import MAX_DESCRIPTORS
from .connection import Connection

#: A write's call: its number (0: none) and the keys the peer is asked to keep for it.
Keep = tuple[int, Sequence[str]]
NO_KEEP: Keep = (0, ())

__all__ = ["Target", "check_slots", "error_of", "guard", "probe", "read", "shaped", "write"]

#: ``done(result)``: a bool array per requested page, or an exception.
Done = Callable[[Any], None]
#: Source offsets above this are refused before the shift is computed (no int64 overflow).
_HUGE = 1 << 62


@dataclass(frozen=True, slots=True)
class Target:
    """What a transfer needs to know about one attached pool on one connection."""

    number: int  # the pool's number on the connection
    geometry: PoolGeometry  # the client pool
    tier: PoolGeometry  # the server tier (same layout, its slot count)
    view: np.ndarray  # uint8 view of the client pool
    #: The tier itself, mapped here, on a shared-memory connection (see .shared); else None.
    tier_view: np.ndarray | None = None

    @classmethod
    def make(
        cls,
        number: int,
        geometry: PoolGeometry,
        slots: int,
        view: np.ndarray,
        tier_view: np.ndarray | None = None,
    ) -> Target:
        tier = replace(
            geometry, name=f"{geometry.name}.peer", tokens=slots * geometry.page_size, device="cpu"
        )
        return cls(number, geometry, tier, view, tier_view)

    @property
    def shared(self) -> bool:
        return self.tier_view is not None

    def endpoints(self) -> tuple[Endpoint, Endpoint]:
        """(tier, pool) as copy endpoints (shared-memory connections only)."""
        tier = self.tier_view
        assert tier is not None
        return _endpoint(tier), _endpoint(self.view)


def _endpoint(view: np.ndarray) -> Endpoint:
    return Endpoint(int(view.ctypes.data), len(view), "cpu", view)


def error_of(reply: Any, what: str) -> Exception | None:
    """The exception a reply stands for (an ERROR message or a TransportError), else None."""
    if isinstance(reply, Exception):
        return reply
    if isinstance(reply, m.Error):
        text = f"{what}: the peer refused: {reply.text}"
        if reply.code == m.Err.CAPACITY:
            return CapacityError(text)
        if reply.code == m.Err.UNSUPPORTED:
            return UnsupportedError(text)
        if reply.code == m.Err.BAD_REQUEST:
            return PoolError(text)
        if reply.code == m.Err.AUTH:
            return AuthenticationError(text)
        return TransportError(text)
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


def _post(
    conn: Connection,
    offsets: np.ndarray,
    lengths: np.ndarray,
    view: np.ndarray,
    send: bool,
    tag_base: int,
    done: Callable[[np.ndarray], None],
) -> None:
    """One message per descriptor, ``tag_base + i``, straight from or into ``view``."""
    if len(offsets) and bool(np.any((offsets < 0) | (lengths > len(view) - offsets))):
        raise TransportError("a descriptor falls outside the pool; refusing the batch")
    group = conn.transfer(done, send=send)
    post, ep = conn.link.post, conn.ep
    for i, (offset, length) in enumerate(zip(offsets.tolist(), lengths.tolist(), strict=True)):
        post(group, ep, send, view[offset : offset + length], tag_base + i)


def read(
    conn: Connection,
    target: Target,
    keys: list[str],
    pages: np.ndarray,
    shape: Shape,
    done: Done,
) -> None:
    """Restore ``keys`` into pool ``pages``; ``done(ok per key)`` (False past the claimed run)."""
    n = len(keys)

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
        try:
            plain = build_descriptors(target.tier, slots, target.geometry, pages[:count])
            pool = Cover.of_moves(target.tier, slots, target.geometry, pages[:count])
            what = f"reading {count} pages into pool {target.geometry.name!r}"
            d = shaped(shape, plain, pool, what)
        except KVCRPolicyError as err:
            conn.notify(m.Release(reply.claim))
            done(err)
            return
        tag_base = conn.link.tags(len(d))

        def received(failed: np.ndarray) -> None:
            ok = np.zeros(n, dtype=bool)
            ok[:count] = pool.outcome(d.dst, d.length, failed)
            done(ok)

        _post(conn, d.dst, d.length, target.view, False, tag_base, received)

        def sent(answer: Any) -> None:
            if error_of(answer, "SEND") is not None or not answer.ok:
                # Our receives can no longer all complete: cancel them with the connection.
                conn.fail(f"the peer could not send claim {reply.claim}: {answer}")

        conn.request(m.Send(reply.claim, tag_base, d.src, d.length), sent)

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
        try:
            plain = build_descriptors(target.geometry, sources, target.tier, slots[todo])
            tier = Cover.of_moves(target.geometry, sources, target.tier, slots[todo])
            what = f"writing {len(todo)} pages of pool {target.geometry.name!r}"
            d = shaped(shape, plain, tier, what)
        except KVCRPolicyError as err:
            conn.notify(m.Release(reply.reservation))
            done(err)
            return

        def sent(failed: np.ndarray) -> None:
            flags[todo] = tier.outcome(d.dst, d.length, failed)
            conn.request(m.Commit(reply.reservation, flags), written)

        def posted(answer: Any) -> None:
            error = error_of(answer, "POST")
            if error is not None:  # the server let the reservation go
                done(error)
                return
            if answer.reservation != reply.reservation:
                raise TransportError(f"POSTED names reservation {answer.reservation}")
            _post(conn, d.src, d.length, target.view, True, answer.tag_base, sent)

        conn.request(
            m.Post(reply.reservation, d.dst, d.length), guard(conn, done, "POSTED", posted)
        )

    reserve = m.Reserve(target.number, keys, pages, keep[0], list(keep[1]))
    conn.request(reserve, guard(conn, done, "RESERVED", reserved))


def probe(conn: Connection, target: Target, nbytes: int, done: Done) -> None:
    """One UCX message of ``nbytes`` from the tier into the pool's first bytes (a limit)."""
    if nbytes > len(target.view):
        done(PoolError(f"probe of {nbytes} bytes does not fit the pool ({len(target.view)})"))
        return
    tag = conn.link.tags(1)
    state: dict[str, Any] = {}
    limit = message_limit(conn.op_timeout_s, nbytes)

    def received(failed: np.ndarray) -> None:
        state["received"] = not failed.any()
        if "sent" in state:
            done(state["sent"] and state["received"])

    def sent(answer: Any) -> None:
        error = error_of(answer, "PROBE")
        state["sent"] = error is None and bool(answer.ok)
        if not state["sent"]:
            conn.fail(f"probe failed: {error or 'the peer could not send'}")
        if "received" in state:
            done(state["sent"] and state["received"])

    group = conn.transfer(received, send=False, limit=limit)
    conn.link.post(group, conn.ep, False, target.view[:nbytes], tag)
    conn.request(m.Probe(target.number, tag, nbytes), sent, limit)
