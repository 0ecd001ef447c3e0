"""Session: the server side of one client connection (worker thread only).

A session owns what its client holds on the server: attached pools, claims (a read in flight)
and reservations (a write in flight), each with a deadline. Whatever way the session ends,
every claim is released and every reservation aborted, but only once UCX can no longer
touch the slots: after the session's endpoint is closed and its requests completed, and,
when the server ends the session, after the client closed its side (or a linger timeout).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from kvcr_policy.errors import CapacityError, KVCRPolicyError, PoolError, UnsupportedError
from kvcr_policy.geometry import Layout, PoolGeometry
from kvcr_policy.observability.peer_server import ServerMeter

from ..channel import Channel
from ..requests import Timer
from ..wire import messages as m
from ..worker import Worker
from .tiers import Tier
from .transfers import Attachment, Transfers

__all__ = ["Host", "Session"]

log = logging.getLogger("kvcr_policy.backends.peer.server")

MAX_ATTACHED = 64
#: A connection that has not completed its handshake by then is dropped (it holds a session).
HELLO_TIMEOUT_S = 10.0


class Host(Protocol):
    """What a session needs from the server that accepted it."""

    worker: Worker
    op_timeout_s: float
    linger_s: float
    capabilities: frozenset[str]
    capabilities_mask: int
    server_id: int
    host_id: str
    meter: ServerMeter | None

    def choose_tls(self, hello: m.Hello) -> str: ...

    def check_address(
        self, address: bytes, error_handling: bool, then: Callable[[bool], Any]
    ) -> None: ...

    def open_tier(self, geometry: PoolGeometry, align: int, then: Callable[[Any], Any]) -> None: ...

    def describe(self) -> dict[str, Any]: ...

    def session_closed(self, session: Session, reason: str) -> None: ...


class Session:
    """See the module docstring; built by :class:`~.server.PeerServer`."""

    def __init__(self, server: Host, sock: Any, peer: str) -> None:
        self.server = server
        self.worker = server.worker
        self.op_timeout_s = server.op_timeout_s
        self.accepts = server.capabilities  # descriptor shapes SEND and POST may use
        self.peer = peer
        self.ep: Any = None
        self.tls = ""
        self.state = "hello"  # hello -> checking -> ready -> draining -> closed
        self.heartbeat_s = 0.0
        self.pools: list[Attachment | None] = []
        self.transfers = Transfers(self)
        self._beat: Timer | None = None
        self.channel = Channel(
            self.worker,
            sock,
            name=f"client {peer}",
            on_message=self._on_message,
            on_closed=self._on_closed,
            on_malformed=self._malformed,
        )
        self.meter = server.meter
        self._hello_timer = self.worker.later(HELLO_TIMEOUT_S, self._hello_overdue)

    def _hello_overdue(self) -> None:
        if self.state in ("hello", "checking"):
            log.warning("client %s: no handshake within %s s", self.peer, HELLO_TIMEOUT_S)
            self.channel.close(f"no handshake within {HELLO_TIMEOUT_S} s")

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
        if self.state in ("hello", "checking"):
            self.channel.close("server stopping")
        elif self.state == "ready":
            self.state = "draining"
            self.close_if_drained()

    def close_if_drained(self) -> None:
        if self.state == "draining" and not self.busy:
            self.channel.linger(min(1.0, self.server.linger_s), "server stopping")

    def _on_closed(self, reason: str) -> None:
        self.state = "closed"
        self._hello_timer.cancel()
        if self._beat is not None:
            self._beat.cancel()
        if self.ep is not None:
            ep, self.ep = self.ep, None
            self.worker.close_endpoint(ep, self.tls == "tcp")  # cancels the receives
        self.transfers.close()
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
        if self.state == "hello":
            if not isinstance(message, m.Hello):
                self._unexpected(f"expected HELLO first, got {message.KIND.name}")
                return
            if self.meter is not None:
                self.meter.request("hello")
            self._hello(message, request)
            return
        if self.state == "checking":
            self._unexpected("a request arrived before WELCOME")
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

    def _hello(self, hello: m.Hello, request: int) -> None:
        try:
            tls = self.server.choose_tls(hello)
        except UnsupportedError as err:
            self.channel.fail(m.Err.UNSUPPORTED, str(err))
            return
        self.state = "checking"
        self.tls = tls
        self.heartbeat_s = min(hello.heartbeat_ms, 600_000) / 1000
        self.server.check_address(
            hello.address, tls == "tcp", lambda ok: self._welcome(ok, hello, request)
        )

    def _welcome(self, ok: bool, hello: m.Hello, request: int) -> None:
        if self.channel.closed:
            return
        if not ok:
            self.channel.fail(m.Err.BAD_REQUEST, "the UCX worker address in HELLO is not usable")
            return
        ucx = self.worker.ucx
        try:
            address = ucx.UCXAddress.create_from_buffer(hello.address)
            self.ep = ucx.UCXEndpoint.create_from_worker_address(
                self.worker.ucx_worker, address, self.tls == "tcp"
            )
        except Exception as err:
            self.channel.fail(m.Err.BAD_REQUEST, f"cannot reach the client over UCX: {err}")
            return
        self.state = "ready"
        tls_code = 1 if self.tls == "sm" else 2
        welcome = m.Welcome(
            self.server.capabilities_mask,
            tls_code,
            self.server.server_id,
            self.server.host_id,
            self.worker.address,
        )
        self.channel.send(welcome, request)
        log.info("client %s connected (%s, tls %s)", self.peer, hello.name or "?", self.tls)
        if self.heartbeat_s > 0:
            self._beat = self.worker.later(self.heartbeat_s, self._check_alive)

    def _check_alive(self) -> None:
        if self.channel.closed or self.channel.lingering:
            return
        silent = time.monotonic() - self.channel.last_recv
        if silent > 3 * self.heartbeat_s + 1.0:
            self.channel.pump()
            silent = time.monotonic() - self.channel.last_recv
        if not self.channel.closed and silent > 3 * self.heartbeat_s + 1.0:
            self.abort(m.Err.TIMEOUT, f"client silent for {silent:.1f} s")
            return
        self._beat = self.worker.later(self.heartbeat_s, self._check_alive)

    def pool(self, number: int) -> Attachment:
        pool = self.pools[number] if number < len(self.pools) else None
        if pool is None:
            raise PoolError(f"no attached pool number {number} (attached: {len(self.pools)})")
        return pool

    def deadline(self, what: str) -> Timer:
        timeout = self.op_timeout_s
        return self.worker.later(
            timeout, lambda: self.abort(m.Err.TIMEOUT, f"{what} exceeded {timeout} s")
        )

    # ---- handlers -------------------------------------------------------------------------

    def _attach(self, msg: m.Attach, request: int) -> None:
        if len(self.pools) >= MAX_ATTACHED:
            raise CapacityError(f"a connection may attach at most {MAX_ATTACHED} pools")
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
            self.pools[number] = Attachment(tier, client)
            self.channel.send(m.Attached(number, tier.slots), request)

        self.server.open_tier(client, msg.align, opened)

    def _exists(self, msg: m.Exists, request: int) -> None:
        store = self.pool(msg.pool).tier.store
        self.channel.send(m.Count(store.contains_prefix(msg.keys)), request)

    def _delete(self, msg: m.Delete, request: int) -> None:
        self.channel.send(m.Count(self.pool(msg.pool).tier.store.delete(msg.keys)), request)

    def _clear(self, msg: m.Clear, request: int) -> None:
        self.channel.send(m.Count(self.pool(msg.pool).tier.store.clear()), request)

    def _stats(self, msg: m.Stats, request: int) -> None:
        data = {"tier": self.pool(msg.pool).tier.stats(), "server": self.server.describe()}
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
}
_WHILE_DRAINING = {m.Send, m.Release, m.Post, m.Commit, m.Ping, m.Stats}
#: What the server's metrics count requests by: HELLO and every client request's kind.
REQUEST_KINDS = ["hello", *(cls.KIND.name.lower() for cls in _HANDLERS)]
