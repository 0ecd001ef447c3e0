"""Client-side transfers on a connection (engine thread): read, write, probe.

A read: CLAIM -> the server's slots -> plan -> post one receive per wire descriptor straight
into pool memory -> SEND -> the server sends -> per-page outcome from the receives. A write:
RESERVE -> the server posted receives into the reserved slots -> plan (checked against the
server's digest) -> post sends straight from pool memory -> COMMIT what was sent -> WRITTEN.
Only pages all of whose descriptors completed count; a merged descriptor that failed fails
every page it covers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvcr_policy.errors import CapacityError, PoolError, TransportError, UnsupportedError
from kvcr_policy.geometry import PoolGeometry

from . import messages as m
from .connection import Connection
from .plan import WirePlan, page_outcome, wire_plan

__all__ = ["Target", "error_of", "probe", "read", "write"]

#: ``done(result)``: a bool array per requested page, or an exception.
Done = Callable[[Any], None]


@dataclass(frozen=True, slots=True)
class Target:
    """What a transfer needs to know about one attached pool on one connection."""

    number: int  # the pool's number on the connection
    geometry: PoolGeometry  # the client pool
    tier: PoolGeometry  # the server tier (same layout, its slot count)
    view: np.ndarray  # uint8 view of the client pool
    merge: bool
    split: int

    @classmethod
    def make(
        cls,
        number: int,
        geometry: PoolGeometry,
        slots: int,
        view: np.ndarray,
        merge: bool,
        split: int,
    ) -> Target:
        tier = replace(
            geometry, name=f"{geometry.name}.peer", tokens=slots * geometry.page_size, device="cpu"
        )
        return cls(number, geometry, tier, view, merge, split)


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
        return TransportError(text)
    return None


def _slots(conn: Connection, target: Target, slots: np.ndarray, limit: int) -> np.ndarray:
    """Server-sent slots, refused (connection failed) unless they fit what we asked for."""
    bad = len(slots) > limit or (
        len(slots) and (slots.min() < 0 or slots.max() >= target.tier.pages)
    )
    if bad:
        raise TransportError(f"the peer answered {len(slots)} slots out of range or over {limit}")
    return slots


def _guard(
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


def _post(
    conn: Connection,
    plan: WirePlan,
    target: Target,
    send: bool,
    tag_base: int,
    done: Callable[[np.ndarray], None],
) -> None:
    d = plan.descriptors
    offsets = d.src if send else d.dst
    if len(d) and int((offsets + d.length).max()) > len(target.view):
        raise TransportError("a wire descriptor falls outside the pool; refusing the batch")
    group = conn.transfer(done, send=send)
    view, post, ep = target.view, conn.engine.post, conn.ep
    for i, (offset, length) in enumerate(zip(offsets.tolist(), d.length.tolist(), strict=True)):
        post(group, ep, send, view[offset : offset + length], tag_base + i)


def read(conn: Connection, target: Target, keys: list[str], pages: np.ndarray, done: Done) -> None:
    """Restore ``keys`` into pool ``pages``; ``done(ok per key)`` (False past the claimed run)."""
    n = len(keys)

    def claimed(reply: Any) -> None:
        error = error_of(reply, "CLAIM")
        if error is not None:
            done(error)
            return
        slots = _slots(conn, target, reply.slots, n)
        count = len(slots)
        if count == 0:
            done(np.zeros(n, dtype=bool))
            return
        plan = wire_plan(
            target.tier,
            slots,
            target.geometry,
            pages[:count],
            merge=target.merge,
            split_bytes=target.split,
        )
        tag_base = conn.engine.tags(plan.count)

        def received(failed: np.ndarray) -> None:
            ok = np.zeros(n, dtype=bool)
            ok[:count] = page_outcome(plan.descriptors, failed, count)
            done(ok)

        _post(conn, plan, target, False, tag_base, received)

        def sent(answer: Any) -> None:
            if error_of(answer, "SEND") is not None or not answer.ok:
                # Our receives can no longer all complete: cancel them with the connection.
                conn.fail(f"the peer could not send claim {reply.claim}: {answer}")

        conn.request(m.Send(reply.claim, tag_base, plan.count, plan.nbytes, plan.digest), sent)

    conn.request(m.Claim(target.number, keys, pages), _guard(conn, done, "CLAIMED", claimed))


def write(conn: Connection, target: Target, keys: list[str], pages: np.ndarray, done: Done) -> None:
    """Store pool ``pages`` under ``keys``; ``done(ok per key)`` (True also where present)."""
    n = len(keys)

    def reserved(reply: Any) -> None:
        error = error_of(reply, "RESERVE")
        if error is not None:
            done(error)
            return
        slots = reply.slots
        covered = len(slots)
        todo = np.flatnonzero(slots >= 0)
        _slots(conn, target, slots[todo], n)
        if covered > n:
            raise TransportError(f"the peer reserved {covered} slots for {n} keys")
        plan = wire_plan(
            target.geometry,
            pages[:covered][todo],
            target.tier,
            slots[todo],
            merge=target.merge,
            split_bytes=target.split,
        )
        theirs = reply.plan
        plan.check(theirs.count, theirs.nbytes, theirs.digest, "the peer")

        def sent(failed: np.ndarray) -> None:
            flags = np.zeros(covered, dtype=bool)
            flags[todo] = page_outcome(plan.descriptors, failed, len(todo))
            conn.request(m.Commit(reply.reservation, flags), written)

        def written(answer: Any) -> None:
            error = error_of(answer, "COMMIT")
            if error is not None:
                done(error)
                return
            ok = np.zeros(n, dtype=bool)
            ok[: min(covered, len(answer.ok))] = answer.ok[:covered]
            done(ok)

        _post(conn, plan, target, True, theirs.tag_base, sent)

    conn.request(m.Reserve(target.number, keys, pages), _guard(conn, done, "RESERVED", reserved))


def probe(conn: Connection, target: Target, nbytes: int, done: Done) -> None:
    """One UCX message of ``nbytes`` from the tier into the pool's first bytes (a limit)."""
    if nbytes > len(target.view):
        done(PoolError(f"probe of {nbytes} bytes does not fit the pool ({len(target.view)})"))
        return
    tag = conn.engine.tags(1)
    state: dict[str, Any] = {}

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

    group = conn.transfer(received, send=False)
    conn.engine.post(group, conn.ep, False, target.view[:nbytes], tag)
    conn.request(m.Probe(target.number, tag, nbytes), sent)
