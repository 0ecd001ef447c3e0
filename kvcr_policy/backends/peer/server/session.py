"""Session: the server side of one client connection (worker thread only).

A connection first shakes hands (:mod:`.handshake`): until its client has proved that it holds
a tenant's secret it can reach nothing else. From then on the session belongs to that tenant:
every pool it attaches is one of the tenant's tiers, so every key it names is scoped to the
tenant by the server (a client cannot name another tenant's tier, keys or bytes).

A session owns what its client holds on the server: attached pools, claims (a read in flight)
and reservations (a write in flight), each with a deadline. Whatever way the session ends,
every claim is released and every reservation aborted, but only once UCX can no longer
touch the slots: after the session's endpoint is closed and its requests completed, and,
when the server ends the session, after the client closed its side (or a linger timeout).
A session whose client sends nothing (not even a heartbeat) for ``security.idle_timeout_s``
is closed.

A session on the server's Unix socket is a same-host client's (``local``: its pid and uid, read
with ``SO_PEERCRED``): once authenticated it needs no UCX at all (``tls`` shm). Each pool it
attaches comes with the tier's memfd, and it moves pages by copying to and from that memory
(:mod:`.transfers`); the pidfd opened at accept tells the quarantine when its process is gone.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

from kvcr_policy.errors import CapacityError, KVCRPolicyError, PoolError, UnsupportedError
from kvcr_policy.geometry import Layout, PoolGeometry
from kvcr_policy.values import shorten

from ..channel import Channel
from ..link import Link
from ..requests import RequestGroup, Stall, Timer
from ..wire import messages as m
from ..wire.framing import MAX_PAYLOAD
from ..worker import Worker
from .budget import FREE_PAYLOAD
from .handshake import HELLO_LIMIT, Admitter, Handshake
from .meter import ServerMeter
from .quarantine import Held
from .tiers import Tier
from .transfers import Attachment, Transfers

__all__ = ["Host", "LocalPeer", "Session"]

log = logging.getLogger("kvcr_policy.backends.peer.server")

MAX_ATTACHED = 64
#: A closed session's link outlives the transfers' own limit by this much (see _on_closed).
_RETIRE_SLACK_S = 0.5
#: An authenticated client whose address check has not ended by then is dropped (the check
#: runs in a helper process that may be starting).
CHECK_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class LocalPeer:
    """A client on the server's Unix socket: its process (``SO_PEERCRED``) and a pidfd of it
    (None when none could be opened)."""

    pid: int
    uid: int
    pidfd: int | None


class Host(Admitter, Protocol):
    """What a session needs from the server that accepted it (a handshake's too)."""

    worker: Worker
    op_timeout_s: float
    linger_s: float
    handshake_timeout_s: float
    idle_timeout_s: float
    dead_after_s: float
    capabilities: frozenset[str]
    capabilities_mask: int
    server_id: int
    host_id: str
    meter: ServerMeter | None
    local_name: str

    def open_tier(
        self, tenant: str, geometry: PoolGeometry, align: int, then: Callable[[Any], Any]
    ) -> None: ...

    def describe(self, tenant: str, admin: bool) -> dict[str, Any]: ...

    def session_closed(self, session: Session, reason: str) -> None: ...

    def hold(self, pidfd: int | None, items: list[Held], who: str) -> None: ...


class Session:
    """See the module docstring; built by :class:`~.server.PeerServer`."""

    def __init__(self, server: Host, sock: Any, peer: str, local: LocalPeer | None = None) -> None:
        self.server = server
        self.local = local
        self.client_host = ""  # the client's host id, from HELLO
        self.worker = server.worker
        self.op_timeout_s = server.op_timeout_s
        self.accepts = server.capabilities  # descriptor shapes SEND and POST may use
        self.peer = peer
        self.ep: Any = None
        self.link: Link | None = None  # the session's UCX worker, from WELCOME on
        self.tls = ""
        # hello -> auth -> checking -> ready -> draining -> closed
        self.state = "hello"
        self.tenant = ""
        self.admin = False
        self.heartbeat_s = 0.0
        self._pidfd_given = False  # the quarantine took the local client's pidfd
        self.pools: list[Attachment | None] = []
        self.transfers = Transfers(self)
        self.handshake: Handshake | None = Handshake(self)
        self._beat: Timer | None = None
        self.channel = Channel(
            self.worker,
            sock,
            name=f"client {peer}",
            on_message=self._on_message,
            on_closed=self._on_closed,
            on_malformed=self._malformed,
            max_payload=HELLO_LIMIT,
            frame_timeout_s=server.handshake_timeout_s,
            budget=server.admission.budget,
            free_payload=FREE_PAYLOAD,
            tenant=lambda: self.tenant or None,
        )
        self.meter = server.meter
        limit = server.handshake_timeout_s
        self._deadline = self.worker.later(limit, lambda: self._overdue(("hello", "auth"), limit))

    def _overdue(self, states: tuple[str, ...], limit: float) -> None:
        if self.state in states:
            self.server.admission.refused(f"client {self.peer}: no handshake within {limit} s")
            self.channel.close(f"no handshake within {limit} s")

    def authenticated(self, tenant: str, admin: bool) -> None:
        """The client proved it holds ``tenant``'s secret: its UCX address is checked next."""
        self.tenant, self.admin = tenant, admin
        self.state = "checking"
        self._deadline.cancel()
        limit = CHECK_TIMEOUT_S
        self._deadline = self.worker.later(limit, lambda: self._overdue(("checking",), limit))

    @property
    def busy(self) -> bool:
        return self.transfers.busy

    @property
    def groups(self) -> int:
        return self.transfers.groups

    # ---- lifetime -------------------------------------------------------------------------

    def abort(self, code: int, text: str) -> None:
        """End the session from this side: tell the client, wait for it to let go, release."""
        if self.channel.closed or self.channel.lingering:
            return
        log.warning("client %s: %s; ending its session", self.peer, text)
        self.channel.send(m.Error(code, text))
        self.channel.linger(self.server.linger_s, text)

    def drain(self) -> None:
        """Server stopping: refuse new work; close once in-flight work is done."""
        if self.state in ("hello", "auth", "checking"):
            self.channel.close("server stopping")
        elif self.state == "ready":
            self.state = "draining"
            self.close_if_drained()

    def close_if_drained(self) -> None:
        if self.state == "draining" and not self.busy:
            self.channel.linger(min(1.0, self.server.linger_s), "server stopping")

    def _on_closed(self, reason: str) -> None:
        self.state = "closed"
        self.handshake = None
        self._deadline.cancel()
        if self._beat is not None:
            self._beat.cancel()
        if self.ep is not None and self.link is not None:
            ep, self.ep = self.ep, None
            self.link.close_endpoint(ep, self.tls == "tcp")  # cancels the receives
        self.transfers.close()
        if self.local is not None and self.local.pidfd is not None and not self._pidfd_given:
            os.close(self.local.pidfd)
        if self.link is not None:
            # After the transfers' own limit (op_timeout_s: see .transfers), what is still
            # pending is abandoned and the link frozen; a link with nothing left goes at once.
            self.link.retire(self.op_timeout_s + _RETIRE_SLACK_S)
        self.server.session_closed(self, reason)

    # ---- dispatch -------------------------------------------------------------------------

    def _malformed(self) -> None:
        if self.meter is not None:
            self.meter.reject("malformed")

    def _unexpected(self, text: str) -> None:
        if self.meter is not None:
            self.meter.reject("unexpected")
        self.channel.fail(m.Err.PROTOCOL, text)

    def _on_message(self, message: m.Message, request: int) -> None:
        if self.handshake is not None:
            if self.meter is not None:
                if isinstance(message, (m.Hello, m.Auth)):
                    self.meter.request(message.KIND.name.lower())
                else:
                    self.meter.reject("unexpected")
            self.handshake.on_message(message, request)
            return
        handler = _HANDLERS.get(type(message))
        if handler is None:
            self._unexpected(f"{message.KIND.name} is not a client request")
            return
        if self.meter is not None:
            self.meter.request(message.KIND.name.lower())
        if self.state == "draining" and type(message) not in _WHILE_DRAINING:
            self.channel.send(m.Error(m.Err.SHUTTING_DOWN, "the peer is shutting down"), request)
            return
        try:
            handler(self, message, request)
            number = getattr(message, "pool", None)
            if self.meter is not None and isinstance(number, int):
                self.meter.tier(self.pool(number).tier)  # the tier's gauges follow each request
        except (PoolError, UnsupportedError, CapacityError) as err:
            self.channel.send(m.Error(_code(err), str(err)), request)
        except KVCRPolicyError as err:
            self.abort(m.Err.BAD_REQUEST, str(err))
        except Exception as err:  # a bug here must cost one session, never the server
            log.exception("client %s: %s failed", self.peer, message.KIND.name)
            self.abort(m.Err.INTERNAL, f"internal error: {type(err).__name__}: {err}")

    def welcome(self, ok: bool | Exception, address: bytes, name: str, request: int) -> None:
        """The address check ended: open the UCX endpoint and say WELCOME (or refuse)."""
        if self.channel.closed:
            return
        if isinstance(ok, Exception):
            self.channel.fail(_code(ok), str(ok), request)
            return
        if not ok:
            text = "the UCX worker address in AUTH is not usable"
            self.channel.fail(m.Err.BAD_REQUEST, text, request)
            return
        if self.tls != "shm":
            try:
                self.link = self.worker.open_link(f"client {self.peer}", self.tls == "sm")
                self.ep = self.link.connect(address, self.tls == "tcp")
            except Exception as err:
                text = f"cannot reach the client over UCX: {err}"
                self.channel.fail(m.Err.BAD_REQUEST, text, request)
                return
        self._deadline.cancel()
        self.handshake = None
        self.state = "ready"
        self.channel.reader.limit = MAX_PAYLOAD
        self.channel.frame_timeout_s = self.op_timeout_s
        tls_code = {"sm": 1, "tcp": 2, "shm": 3}[self.tls]
        # A same-host client of a TCP session learns where its pages can move by memory copy.
        same_host = self.tls != "shm" and self.client_host == self.server.host_id
        welcome = m.Welcome(
            self.server.capabilities_mask,
            tls_code,
            self.server.server_id,
            self.server.host_id,
            self.link.address if self.link is not None else b"",
            self.tenant,
            self.server.local_name if same_host else "",
        )
        self.channel.send(welcome, request)
        log.info(
            "client %s connected (%s, tenant %s, tls %s)",
            self.peer,
            name or "?",
            self.tenant,
            self.tls,
        )
        self._beat = self.worker.later(self._check_every(), self._check_alive)

    def _silence_limit(self) -> float:
        """How long the client may send nothing: ``dead_after_s`` (at least two of the client's
        heartbeats) while it pings, never more than the idle timeout."""
        idle = self.server.idle_timeout_s
        if self.heartbeat_s <= 0:
            return idle
        return min(idle, max(self.server.dead_after_s, 2 * self.heartbeat_s))

    def _check_every(self) -> float:
        return max(0.05, self.heartbeat_s or self._silence_limit() / 4)

    def _check_alive(self) -> None:
        if self.channel.closed or self.channel.lingering:
            return
        limit = self._silence_limit()
        silent = time.monotonic() - self.channel.last_frame
        if silent > limit:
            self.channel.pump()
            silent = time.monotonic() - self.channel.last_frame
        if not self.channel.closed and silent > limit:
            self.abort(m.Err.TIMEOUT, f"client silent for {silent:.1f} s (limit {limit:.1f} s)")
            return
        self._beat = self.worker.later(self._check_every(), self._check_alive)

    def hold(self, items: list[Held]) -> None:
        """Reservations this shared-memory client may still be writing (see .quarantine)."""
        pidfd = self.local.pidfd if self.local is not None else None
        self._pidfd_given = pidfd is not None
        self.server.hold(pidfd, items, self.peer)

    def pool(self, number: int) -> Attachment:
        pool = self.pools[number] if number < len(self.pools) else None
        if pool is None:
            raise PoolError(f"no attached pool number {number} (attached: {len(self.pools)})")
        return pool

    def deadline(self, what: str, limit: float | None = None) -> Timer:
        """Abort the session unless cancelled within ``limit`` (default ``op_timeout_s``)."""
        timeout = self.op_timeout_s if limit is None else limit
        return self.worker.later(
            timeout, lambda: self.abort(m.Err.TIMEOUT, f"{what} exceeded {timeout} s")
        )

    def stall(self, what: str, group: RequestGroup) -> Stall:
        """Abort the session once ``group``'s messages stop completing for ``op_timeout_s``."""
        timeout = self.op_timeout_s
        return Stall(
            self.worker.later,
            timeout,
            lambda: group.progress,
            lambda: self.abort(m.Err.TIMEOUT, f"{what} made no progress for {timeout} s"),
        )

    # ---- handlers -------------------------------------------------------------------------

    def _attach(self, msg: m.Attach, request: int) -> None:
        if len(self.pools) >= MAX_ATTACHED:
            raise CapacityError(f"a connection may attach at most {MAX_ATTACHED} pools")
        if not msg.name or not msg.name.isprintable():  # it reaches logs and metrics
            raise PoolError(f"ATTACH: a pool name is printable text, got {shorten(msg.name)}")
        client = PoolGeometry(
            name=msg.name,
            layout=cast(Layout, msg.layout),  # PoolGeometry refuses an unknown one
            layers=msg.layers,
            heads=msg.heads,
            head_dim=msg.head_dim,
            dtype=msg.dtype,
            page_size=msg.page_size,
            tokens=msg.tokens,
            mla=msg.mla,
        )
        if client.nbytes > 1 << 50:
            raise PoolError(f"pool {msg.name!r} of {client.nbytes} bytes is not plausible")
        number = len(self.pools)
        self.pools.append(None)  # the number is taken now; the tier may take a while

        def opened(tier: Tier | Exception) -> None:
            if isinstance(tier, Exception):
                self.channel.send(m.Error(_code(tier), str(tier)), request)
                return
            if self.tls != "shm":
                self.pools[number] = Attachment(tier, client)
                self.channel.send(m.Attached(number, tier.slots, 0, 0), request)
                return
            if tier.share is None or tier.view is None:
                text = (
                    f"pool {msg.name!r}: this server's placement strategy keeps its tiers "
                    "private, so a shared-memory session cannot map them; connect over TCP "
                    "(transport.options.shared_memory = 'off')"
                )
                self.channel.send(m.Error(m.Err.UNSUPPORTED, text), request)
                return
            self.pools[number] = Attachment(tier, client)
            fd, offset = tier.share
            attached = m.Attached(number, tier.slots, offset, len(tier.view))
            self.channel.send(attached, request, fds=(fd,))

        self.server.open_tier(self.tenant, client, msg.align, opened)

    def _exists(self, msg: m.Exists, request: int) -> None:
        store = self.pool(msg.pool).tier.store
        self.channel.send(m.Count(store.contains_prefix(msg.keys)), request)

    def _delete(self, msg: m.Delete, request: int) -> None:
        self.channel.send(m.Count(self.pool(msg.pool).tier.store.delete(msg.keys)), request)

    def _clear(self, msg: m.Clear, request: int) -> None:
        self.channel.send(m.Count(self.pool(msg.pool).tier.store.clear()), request)

    def _stats(self, msg: m.Stats, request: int) -> None:
        tier = self.pool(msg.pool).tier.stats()
        data = {"tier": tier, "server": self.server.describe(self.tenant, self.admin)}
        self.channel.send(m.StatsReply(json.dumps(data, default=str)), request)

    def _ping(self, msg: m.Ping, request: int) -> None:
        self.channel.send(m.Pong(), request)


def _code(err: Exception) -> int:
    """The ERROR code a refused request gets."""
    if isinstance(err, UnsupportedError):
        return m.Err.UNSUPPORTED
    if isinstance(err, CapacityError):
        return m.Err.CAPACITY
    if isinstance(err, PoolError):
        return m.Err.BAD_REQUEST
    return m.Err.INTERNAL


_HANDLERS: dict[type[m.Message], Any] = {
    m.Attach: Session._attach,
    m.Exists: Session._exists,
    m.Claim: lambda s, msg, r: s.transfers.claim(msg, r),
    m.Send: lambda s, msg, r: s.transfers.send(msg, r),
    m.Release: lambda s, msg, r: s.transfers.release_message(msg, r),
    m.Reserve: lambda s, msg, r: s.transfers.reserve(msg, r),
    m.Post: lambda s, msg, r: s.transfers.post(msg, r),
    m.Commit: lambda s, msg, r: s.transfers.commit(msg, r),
    m.Delete: Session._delete,
    m.Clear: Session._clear,
    m.Stats: Session._stats,
    m.Probe: lambda s, msg, r: s.transfers.probe(msg, r),
    m.Ping: Session._ping,
    m.Copied: lambda s, msg, r: s.transfers.copied(msg, r),
}
_WHILE_DRAINING = {m.Send, m.Release, m.Post, m.Commit, m.Ping, m.Stats, m.Copied}
#: What the server's metrics count requests by: HELLO and every client request's kind.
REQUEST_KINDS = ["hello", "auth", *(cls.KIND.name.lower() for cls in _HANDLERS)]
