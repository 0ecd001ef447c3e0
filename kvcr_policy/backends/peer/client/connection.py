"""Connection: the client side of one control socket and its UCX endpoint (worker thread).

Requests are sent with :meth:`Connection.request`; each reply (or an ERROR for it) goes to
the request's callback, and each request has a deadline. When anything goes wrong (the peer
closes, goes silent, times out, or says something that makes no sense) :meth:`fail` ends the
connection in the one safe order: close the endpoint, which cancels every receive and send
posted on it, let those complete, and only then close the socket, so a server that sees the
socket close knows this side no longer reads its memory. Every waiting callback then gets a
:class:`~kvcr_policy.errors.TransportError`.

Each connection has a UCX worker of its own (a :class:`~..link.Link`), retired with it: what a
peer that died mid-transfer left in that worker never reaches the next connection. A
connection on the server's Unix socket (``local``) has none: its pages move by memory copy
through the tiers the server passes it (:attr:`Connection.channel` takes their memfds), and
``copier`` (a host copy engine of this process) does the copying.

Liveness: while the connection waits for the peer (anything sent since the peer's last frame),
it pings every ``heartbeat_s``; the peer is dead only when nothing at all came back for
``dead_after_s`` since the first of those frames was sent. A late answer counts as life, and
time this side itself spent stalled (a busy host, a long call holding the GIL) never counts
against the peer: the clock starts when a frame actually left, and bytes that arrived while
this side was stalled are read before the peer is judged.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvcr_policy.errors import BackendUnavailableError
from kvcr_policy.observability.repeats import Repeats

from ..channel import Channel
from ..link import Link
from ..requests import RequestGroup, Stall, Timer
from ..wire import messages as m
from ..worker import Worker

__all__ = ["Connection", "Reply"]

log = logging.getLogger("kvcr_policy.backends.peer.client")
_repeats = Repeats(log)  # a peer that is down fails every connect: one line per interval

#: A reply callback receives the reply message, an ERROR message, or a TransportError.
Reply = Callable[[Any], None]
#: How long a failed connection's cancelled UCX requests get to complete before what is left is
#: abandoned and the socket closed.
_RETIRE_GRACE_S = 2.0


@dataclass(slots=True)
class _Pending:
    kind: str
    callback: Reply
    timer: Timer


class Connection:
    """See the module docstring; built by :class:`~.client.PeerClient`."""

    def __init__(
        self,
        worker: Worker,
        sock: Any,
        peer: str,
        op_timeout_s: float,
        dead_after_s: float,
        *,
        local: bool = False,
        copier: Any = None,
    ) -> None:
        self.worker = worker
        self.peer = peer
        self.op_timeout_s = op_timeout_s
        self.dead_after_s = dead_after_s
        self.local = local
        self.copier = copier  # a host copy transport (submit(CopyBatch)): local connections
        self.copies = 0  # copies finished on a local connection (a late reply waits on them)
        link = None if local else worker.open_link(f"peer {peer}")
        self.link: Link = link  # type: ignore[assignment]  # None on a local connection
        self.ep: Any = None
        self.welcome: m.Welcome | None = None
        self.challenged = False  # the peer answered HELLO (it took this connection in)
        self.tls = ""
        self.dead: str | None = None
        self.groups = 0
        self._sending: set[RequestGroup] = set()
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._beat: Timer | None = None
        self._closing: Timer | None = None
        self.channel = Channel(
            worker,
            sock,
            name=f"peer {peer}",
            on_message=self._on_message,
            on_closed=self._on_closed,
            accept_fds=local,
        )

    @property
    def capabilities(self) -> frozenset[str]:
        return m.capability_names(self.welcome.capabilities if self.welcome else 0)

    def request(
        self,
        message: m.Message,
        callback: Reply,
        timeout: float | None = None,
        knob: str = "transport.op_timeout_s",
    ) -> None:
        """Send ``message``; ``callback`` gets its reply, or a TransportError once ``timeout``
        (default op_timeout_s; ``knob`` names the setting that gave it) passed without one and
        without a UCX message completing on this connection (see :meth:`_no_reply`)."""
        if self.dead is not None:
            callback(BackendUnavailableError(f"peer {self.peer}: connection ended: {self.dead}"))
            return
        number = next(self._ids)
        limit = self.op_timeout_s if timeout is None else timeout
        kind = message.KIND.name
        moved = self.completions
        timer = self.worker.later(limit, lambda: self._no_reply(number, moved, limit, knob))
        self._pending[number] = _Pending(kind, callback, timer)
        self.channel.send(message, number)

    def _no_reply(self, number: int, moved: int, limit: float, knob: str) -> None:
        """``limit`` passed since request ``number`` was sent (or last re-armed). A reply that
        follows data (SEND answers once its pages arrived) waits while UCX messages keep
        completing on this connection: a busy host makes it late, not failed. Without a reply
        and with no message completed for ``limit``, the connection fails."""
        pending = self._pending.get(number)
        if pending is None:
            return
        now = self.completions
        if now != moved:
            pending.timer = self.worker.later(
                limit, lambda: self._no_reply(number, now, limit, knob)
            )
            return
        self.fail(f"{pending.kind} got no reply within {limit} s ({knob})")

    @property
    def completions(self) -> int:
        """UCX messages completed on this connection (copies finished, on a local one)."""
        return self.link.completions if self.link is not None else self.copies

    def notify(self, message: m.Message) -> None:
        """Send a message that has no reply (RELEASE)."""
        if self.dead is None:
            self.channel.send(message, 0)

    def transfer(
        self, done: Callable[[Any], None], *, send: bool, limit: float | None = None
    ) -> RequestGroup:
        """A request group counted against this connection until it completes; one whose
        messages stop completing for ``op_timeout_s`` ends the connection (which cancels it).
        A transfer that keeps moving is never cut, however long a busy host makes it (``limit``
        replaces ``op_timeout_s`` for a transfer of one large message)."""
        self.groups += 1
        limit = self.op_timeout_s if limit is None else limit
        what = "sends" if send else "receives"

        def stalled() -> None:
            self.fail(f"{what} made no progress for {limit} s (transport.op_timeout_s)")

        def finished(failed: Any) -> None:
            self.groups -= 1
            deadline.cancel()
            self._sending.discard(group)
            try:
                done(failed)
            finally:
                self._close_when_settled()

        group = RequestGroup(finished, sending=send)
        deadline = Stall(self.worker.later, limit, lambda: group.progress, stalled)
        if send:
            self._sending.add(group)
        self.link.track(group)
        return group

    def start_heartbeat(self, interval: float) -> None:
        if interval > 0:
            self._beat = self.worker.later(interval, lambda: self._heartbeat(interval))

    def _heartbeat(self, interval: float) -> None:
        if self.dead is not None:
            return
        channel = self.channel
        waiting = channel.waiting_since
        if waiting is not None and time.monotonic() - waiting > self.dead_after_s:
            channel.pump()  # this side may have been the one stalled, the answer waiting
            waiting = channel.waiting_since
            silent = time.monotonic() - (waiting or 0.0)
            if self.dead is None and waiting is not None and silent > self.dead_after_s:
                self.fail(
                    f"peer answered nothing for {silent:.1f} s (transport.options.dead_after_s "
                    f"= {self.dead_after_s} s; pinged every {interval} s)"
                )
                return
        now = time.monotonic()
        if now - channel.last_sent >= interval or now - channel.last_recv >= interval:
            channel.send(m.Ping(), 0)
        self._beat = self.worker.later(interval, lambda: self._heartbeat(interval))

    def _on_message(self, message: m.Message, request: int) -> None:
        if isinstance(message, m.Pong):
            return
        pending = self._pending.pop(request, None)
        if pending is None:
            if isinstance(message, m.Error):
                self.fail(f"the peer ended the session: {message.text}")
            else:
                self.fail(f"unexpected {message.KIND.name} for request {request}")
            return
        pending.timer.cancel()
        try:
            pending.callback(message)
        except Exception as err:  # a reply that breaks its handler breaks the connection
            log.exception("peer %s: handling %s failed", self.peer, message.KIND.name)
            self.fail(f"bad {message.KIND.name} reply: {err}")

    def fail(self, reason: str, *, expected: bool = False) -> None:
        """End the connection (see the module docstring); idempotent."""
        if self.dead is not None:
            return
        self.dead = reason
        if expected:
            log.info("peer %s: %s; connection closed", self.peer, reason)
        else:
            kind = f"{self.peer} {reason}"
            _repeats.warning(kind, "peer %s: %s; connection closed", self.peer, reason)
        if self._beat is not None:
            self._beat.cancel()
        if self.ep is not None:
            ep, self.ep = self.ep, None
            self.link.close_endpoint(ep, self.tls == "tcp")  # cancels the receives posted on it
        if self.link is not None:
            for group in list(self._sending):
                self.link.abandon(group)  # sends only read our memory; COMMIT never follows
            # Receives still pending after the grace are abandoned and the link frozen: their
            # memory is then never written again (see ..link), and the reads report misses.
            self.link.retire(_RETIRE_GRACE_S)
        pending, self._pending = self._pending, {}
        error = BackendUnavailableError(f"peer {self.peer}: {reason}")
        for entry in pending.values():
            entry.timer.cancel()
            try:
                entry.callback(error)
            except Exception:
                log.exception("peer %s: failing %s", self.peer, entry.kind)
        # Cancelled requests complete on the next progress; close the socket after that.
        self._closing = self.worker.later(_RETIRE_GRACE_S, lambda: self.channel.close(reason))
        self._close_when_settled()

    def _close_when_settled(self) -> None:
        if self.dead is not None and self.groups == 0:
            self.worker.call(self.channel.close, self.dead)

    def _on_closed(self, reason: str) -> None:
        if self._closing is not None:
            self._closing.cancel()
        if self.dead is None:
            self.fail(reason)
