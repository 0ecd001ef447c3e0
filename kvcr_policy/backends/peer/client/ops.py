"""Client-side transfers over UCX on a connection (worker thread): read, write, probe.

The steps with the server are :mod:`.steps`'; here the bytes move. A read: after the claim,
one receive per shaped descriptor posted straight into pool memory -> SEND names each
descriptor's tier bytes -> the server checks them against its claim and sends -> per-page
outcome. A write: after the reservation, POST names the shaped descriptors' tier bytes -> the
server checks them and posts receives into the slots -> POSTED -> sends straight from pool
memory -> the commit of what was sent.

Descriptor ``i`` is UCX message ``tag_base + i``. A page counts only if every message that
touched its bytes completed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kvcr_policy.descriptors import Descriptors
from kvcr_policy.errors import PoolError, TransportError

from ..requests import message_limit
from ..wire import messages as m
from ..wire.coverage import Cover
from .connection import Connection
from .steps import Batch, Done, Move, answered, error_of, guard
from .target import Target

__all__ = ["probe", "receive", "send"]


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


def receive(b: Batch) -> Move:
    """A read's move: receives posted into the pool, then SEND asks the server to send."""
    conn, view = b.conn, b.target.view

    def move(held: int, d: Descriptors, cover: Cover, what: str, finish: Done) -> None:
        tag_base = conn.link.tags(len(d))

        def received(failed: np.ndarray) -> None:
            finish(cover.outcome(d.dst, d.length, failed))

        _post(conn, d.dst, d.length, view, False, tag_base, received)

        def sent(answer: Any) -> None:
            if error_of(answer, "SEND") is not None or not answer.ok:
                # Our receives can no longer all complete: cancel them with the connection.
                conn.fail(f"the peer could not send claim {held}: {answer}")

        conn.request(m.Send(held, tag_base, d.src, d.length), sent)

    return move


def send(b: Batch) -> Move:
    """A write's move: POST has the server post receives into the slots, then sends."""
    conn, view = b.conn, b.target.view

    def move(held: int, d: Descriptors, cover: Cover, what: str, finish: Done) -> None:
        def sent(failed: np.ndarray) -> None:
            finish(cover.outcome(d.dst, d.length, failed))

        def posted(answer: Any) -> None:
            if answer.reservation != held:
                raise TransportError(f"POSTED names reservation {answer.reservation}")
            _post(conn, d.src, d.length, view, True, answer.tag_base, sent)

        # An error answer: the server let the reservation go.
        then = guard(conn, finish, "POSTED", answered(finish, "POST", posted))
        conn.request(m.Post(held, d.dst, d.length), then)

    return move


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
