"""PeerClient: one peer as seen from the pipeline's threads: connect, reconnect, run ops.

Any thread may call :meth:`PeerClient.run`; it gets a live connection (connecting, shaking
hands and attaching every registered pool first if needed), hands the op to the UCX worker
thread and waits for its result. A peer that cannot be reached is not retried again for
``retry_after_s``, or sooner when the attempt cost little (a refused connect, as while a peer
restarts, is tried again after about 50 ms): meanwhile calls fail at once, so a dead peer costs
the pipeline a fast miss, not a connect timeout per page. After a peer restarts, the next call
reconnects.

Trust: client and server each prove that they hold the same secret before anything else
(:mod:`..auth`); the server then scopes everything this client names to the tenant of that
secret. The server validates everything a client sends, the client's UCX worker address
included (see :mod:`kvcr_policy.backends.peer.server.addrcheck`) and every descriptor list
(against what it claimed or reserved for the request); a client trusts a peer that proved it
holds its secret (it unpacks that peer's worker address as UCX does, without a checker
process). A peer that runs without authentication (``serve --insecure``) is refused unless
``security.insecure`` is set here too.

On one host pages move through shared memory: a peer named ``unix:PATH`` is reached on that
socket, and a TCP peer that offers its Unix socket in WELCOME (a server on this host) is left
for it unless ``transport.options.shared_memory`` is ``off``; the session there authenticates
again, and each pool attached on it maps its tier (:mod:`.shared`, :mod:`.copies`). ``require``
refuses a peer that cannot. ``start``, when given, is called once when a ``unix:`` peer cannot
be reached (nothing listens), to start it (the host tier's first rank: :mod:`..host`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import Any, Protocol

from kvcr_policy.errors import (
    AuthenticationError,
    BackendUnavailableError,
    ClosedError,
    KVCRPolicyError,
    TransportError,
    UnsupportedError,
)

from .. import auth
from ..credentials import ClientCredentials
from ..host import host_id
from ..options import UcxOptions, parse_address, unix_address
from ..wire import messages as m
from ..worker import Worker
from .connection import Connection
from .shared import map_tier
from .steps import error_of
from .target import Target

__all__ = ["PeerClient"]


def _shown(unix: str) -> str:
    return "unix:" + ("@" + unix[1:] if unix.startswith("\0") else unix)


log = logging.getLogger("kvcr_policy.backends.peer.client")

_TLS_CODE = {"auto": 0, "sm": 1, "tcp": 2}
ATTACH_TIMEOUT_S = 120.0


class Attachable(Protocol):
    """What the client needs from a pool to attach it on each new connection."""

    def attach_message(self, capabilities: frozenset[str]) -> m.Attach: ...

    def target(
        self, number: int, slots: int, capabilities: frozenset[str], tier_view: Any = None
    ) -> Target: ...


class PeerClient:
    """See the module docstring."""

    def __init__(
        self,
        worker: Worker,
        options: UcxOptions,
        op_timeout_s: float,
        name: str,
        credentials: ClientCredentials | None = None,
        *,
        copier: Any = None,
        start: Callable[[], None] | None = None,
    ) -> None:
        if options.peer is None:
            message = (
                "transport 'ucx' needs a peer: set transport.options.peer = 'HOST:PORT' "
                "(the address `kvcr-policy serve` logs)"
            )
            raise TransportError(message)
        self.worker = worker
        self.options = options
        self.address = options.peer
        self.unix = unix_address(options.peer, where="transport.options.peer")
        if self.unix is None:
            self.host, self.port = parse_address(options.peer, where="transport.options.peer")
        self.copier = copier  # copies pages on a shared-memory connection
        self._start = start
        self._pid = os.getpid()  # a forked child has neither our worker thread nor connection
        self.op_timeout_s = op_timeout_s
        self.retry_after_s = min(1.0, op_timeout_s)
        self.name = name
        self.credentials = credentials or ClientCredentials()
        self.tenant = ""
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._targets: dict[int, Target] = {}  # id(pool) -> Target on the current connection
        self._pools: dict[int, Attachable] = {}
        self._down_until = 0.0
        self._last_error = ""
        self._closed = False
        self.connects = 0
        self.connecting = False  # a connect, handshake and attach is under way

    # ---- connection ---------------------------------------------------------------------

    def connection(self) -> Connection:
        """A live, attached connection (see the module docstring); raises TransportError."""
        if os.getpid() != self._pid:
            message = (
                f"peer {self.address}: this pipeline was built in process {self._pid} and is "
                f"used in {os.getpid()}, a child forked from it, where its connection and worker "
                "thread do not exist; build the pipeline in the process that uses it"
            )
            raise BackendUnavailableError(message)
        conn = self._conn
        if conn is not None and conn.dead is None:
            return conn
        with self._lock:
            if self._closed:
                raise ClosedError(f"peer client {self.address} is closed")
            conn = self._conn
            if conn is not None and conn.dead is None:
                return conn
            now = time.monotonic()
            if now < self._down_until:
                message = (
                    f"peer {self.address} is unreachable ({self._last_error}); next attempt in "
                    f"{self._down_until - now:.2f} s"
                )
                raise BackendUnavailableError(message)
            self.connecting = True
            try:
                conn = self._connect()
            except Exception as err:
                self._last_error = str(err)
                # A failed attempt that cost little (a refused connect: the peer is restarting)
                # is retried soon; one that waited out a timeout, no sooner than retry_after_s.
                spent = time.monotonic() - now
                self._down_until = time.monotonic() + min(self.retry_after_s, 0.05 + 4 * spent)
                if isinstance(err, KVCRPolicyError):
                    raise
                raise BackendUnavailableError(f"peer {self.address}: {err}") from err
            finally:
                self.connecting = False
            self._conn = conn
            self.connects += 1
            return conn

    def _connect(self) -> Connection:
        """Connect, shake hands and attach, within ``connect_timeout_s``.

        A server whose handshake slots are full drops the handshakes that have sent nothing
        yet (:mod:`kvcr_policy.backends.peer.server.admission`); a client starved between its
        connect and its HELLO, on a busy host while silent sockets flood the server, is one of
        them. A connection closed before the peer answered HELLO is therefore tried again,
        after 50 ms and twice as long each time, until ``connect_timeout_s`` is spent.
        """
        timeout = self.options.connect_timeout_s
        deadline = time.monotonic() + timeout
        pause, tries = 0.05, 1
        while True:
            conn = self._open_first(timeout)
            try:
                return self._shake_hands(conn, max(0.0, deadline - time.monotonic()))
            except BackendUnavailableError as err:
                if conn.challenged or conn.dead is None:
                    raise
                if time.monotonic() + pause >= deadline:
                    message = (
                        f"{err} ({tries} connections closed by the peer before it answered "
                        f"HELLO within transport.options.connect_timeout_s = {timeout} s: its "
                        "handshake slots are full, or it is shutting down)"
                    )
                    raise BackendUnavailableError(message) from err
                log.info("peer %s: %s before it answered HELLO; trying again", self.address, err)
            time.sleep(pause)
            pause, tries = min(2 * pause, 1.0), tries + 1
            timeout = max(0.05, deadline - time.monotonic())

    def _open_first(self, timeout: float) -> Connection:
        """:meth:`_open` of the configured peer; a ``unix:`` peer that nobody serves is
        started first when this client was given ``start``."""
        if self.unix is None:
            return self._open(timeout)
        try:
            return self._open(timeout, self.unix)
        except BackendUnavailableError as err:
            cause = err.__cause__
            absent = isinstance(cause, (FileNotFoundError, ConnectionRefusedError))
            if self._start is None or not absent:
                raise
        self._start()
        return self._open(timeout, self.unix)

    def _open(self, timeout: float, unix: str | None = None) -> Connection:
        """A TCP connection to the peer, or one on the Unix socket ``unix`` (a shared-memory
        session), handed to the worker thread (nothing sent yet)."""
        shown = self.address if unix is None else _shown(unix)
        try:
            if unix is None:
                sock = socket.create_connection((self.host, self.port), timeout=timeout)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(timeout)
                    sock.connect(unix)
                except BaseException:
                    sock.close()
                    raise
        except OSError as err:
            message = f"cannot connect to peer {shown}: {err}"
            raise BackendUnavailableError(message) from err
        conn: Connection = self.worker.submit(
            partial(
                Connection,
                self.worker,
                sock,
                shown,
                self.op_timeout_s,
                self.options.dead_after_s,
                local=unix is not None,
                copier=self.copier,
            )
        ).result()
        return conn

    def _shake_hands(self, conn: Connection, timeout: float) -> Connection:
        """HELLO to WELCOME (moving to the peer's shared memory when it offers it) and every
        pool attached on the connection kept; closes what fails."""
        started = time.monotonic()
        try:
            welcome = self._wait(self._hello(conn), timeout, "handshake")
            conn.welcome = welcome
        except BaseException:
            self.worker.call(conn.fail, "handshake failed")
            raise
        if not conn.local:
            conn = self._share(conn, welcome, max(0.05, timeout - (time.monotonic() - started)))
        try:
            targets = {}
            for key, pool in list(self._pools.items()):
                targets[key] = self._attach(conn, pool)
            self._targets = targets
        except BaseException:
            self.worker.call(conn.fail, "attach failed")
            raise
        log.info(
            "connected to peer %s over %s as tenant %s (capabilities %s)",
            self.address,
            conn.tls,
            self.tenant,
            ", ".join(sorted(conn.capabilities)) or "none",
        )
        return conn

    def _share(self, conn: Connection, welcome: Any, timeout: float) -> Connection:
        """The connection to use after a TCP WELCOME: a shared-memory one on the Unix socket
        the peer offered (this host's), or ``conn`` itself (see the module docstring)."""
        mode = self.options.shared_memory
        if mode == "off" or (mode == "auto" and self.options.tls == "tcp"):
            return conn
        if not welcome.local:
            if mode == "require":
                self.worker.call(conn.fail, "no shared memory")
                message = (
                    f"peer {self.address} offers no shared memory (another host, or it runs "
                    "with transport.options.shared_memory = 'off') and this client requires it"
                )
                raise UnsupportedError(message)
            return conn
        try:
            local = self._open(timeout, unix_address(welcome.local))
            try:
                local.welcome = self._wait(self._hello(local), timeout, "handshake")
            except BaseException:
                self.worker.call(local.fail, "handshake failed")
                raise
        except (TransportError, ValueError) as err:
            if mode == "require":
                self.worker.call(conn.fail, "no shared memory")
                raise
            log.warning(
                "peer %s: its shared memory (%s) could not be used, pages move over UCX: %s",
                self.address,
                welcome.local,
                err,
            )
            return conn
        self.worker.call(partial(conn.fail, "moved to shared memory", expected=True))
        return local

    def _hello(self, conn: Connection) -> Future[Any]:
        """HELLO, CHALLENGE (the peer's proof, checked), AUTH (ours), WELCOME: a future of
        the WELCOME; see :mod:`..auth`."""
        future: Future[Any] = Future()
        options = self.options
        secret = self.credentials.secret
        key = auth.key_id(secret) if secret is not None else b""
        nonce = auth.new_nonce()
        hello = m.Hello(
            m.capability_mask(m.CAPABILITIES),
            3 if conn.local else _TLS_CODE[options.tls],
            int(options.heartbeat_s * 1000),
            int(min(self.op_timeout_s, 3600) * 1000),
            host_id(),
            self.name,
            key,
            nonce,
        )
        knob = "transport.options.connect_timeout_s"

        def challenged(reply: Any) -> None:
            conn.challenged = not isinstance(reply, Exception)
            error = error_of(reply, "HELLO")
            if error is None:
                error = self._check_challenge(reply, key, nonce)
            if error is not None:
                future.set_exception(error)
                return
            proof = b""
            address = b"" if conn.local else conn.link.address
            if secret is not None and not reply.insecure:
                proof = auth.proof(secret, "client", key, nonce, reply.nonce, address)
            message = m.Auth(proof, address)
            conn.request(message, welcomed, options.connect_timeout_s, knob)

        def welcomed(reply: Any) -> None:
            error = error_of(reply, "AUTH")
            if error is None and not isinstance(reply, m.Welcome):
                error = TransportError(f"expected WELCOME, got {reply.KIND.name}")
            if error is None and "shaped" not in m.capability_names(reply.capabilities):
                error = UnsupportedError(
                    f"peer {self.address} does not accept shaped descriptor lists; run the "
                    "same kvcr_policy version on both peers"
                )
            if error is None and (reply.tls == 3) != conn.local:
                error = TransportError(f"the peer answered tls {reply.tls} on this connection")
            if error is not None:
                future.set_exception(error)
                return
            conn.tls = {1: "sm", 2: "tcp", 3: "shm"}[reply.tls]
            if not conn.local:
                try:
                    conn.ep = conn.link.connect(reply.address, conn.tls == "tcp")
                except Exception as err:
                    message = f"cannot reach the peer over UCX: {err}"
                    future.set_exception(TransportError(message))
                    return
            conn.start_heartbeat(options.heartbeat_s)
            self.tenant = reply.tenant
            future.set_result(reply)

        self.worker.call(conn.request, hello, challenged, options.connect_timeout_s, knob)
        return future

    def _check_challenge(self, reply: Any, key: bytes, nonce: bytes) -> Exception | None:
        """Why the peer's CHALLENGE is not acceptable, or None."""
        if not isinstance(reply, m.Challenge):
            return TransportError(f"expected CHALLENGE, got {reply.KIND.name}")
        secret = self.credentials.secret
        if reply.insecure:
            if self.credentials.insecure:
                return None
            message = (
                f"peer {self.address} runs without authentication (serve --insecure): anyone "
                "could read what this process stores there; set security.insecure = true on "
                "this client to use it anyway"
            )
            return AuthenticationError(message)
        if secret is None or not auth.verify(
            secret, "server", key, nonce, reply.nonce, reply.proof
        ):
            message = (
                f"peer {self.address} could not prove that it holds this process's secret "
                f"(from {self.credentials.source}): it is another peer, or runs with another "
                "secret or tenants directory"
            )
            return AuthenticationError(message)
        return None

    def _attach(self, conn: Connection, pool: Attachable) -> Target:
        caps = conn.capabilities
        message = pool.attach_message(caps)
        future: Future[Any] = Future()

        def attached(reply: Any) -> None:
            error = error_of(reply, "ATTACH")
            if error is not None:
                future.set_exception(error)
            else:  # the tier's memfd came with this frame on a shared-memory connection
                future.set_result((reply, conn.channel.take_fd() if conn.local else None))

        # A new tier may be pre-faulted first (seconds per GiB on a slow host); heartbeats show
        # the peer is alive meanwhile, so the wait is longer than one operation's.
        timeout = max(self.op_timeout_s, ATTACH_TIMEOUT_S)
        self.worker.call(conn.request, message, attached, timeout)
        reply, fd = self._wait(future, timeout, "attach")
        tier_view = None
        if conn.local:
            expected = pool.target(reply.pool, reply.slots, caps).tier.nbytes
            tier_view = map_tier(fd, reply.shm_offset, reply.shm_bytes, expected, conn.peer)
        return pool.target(reply.pool, reply.slots, caps, tier_view)

    def _wait(self, future: Future[Any], timeout: float, what: str) -> Any:
        try:
            return future.result(timeout + 1.0)
        except FutureTimeout:
            message = f"peer {self.address}: {what} took over {timeout} s"
            raise BackendUnavailableError(message) from None

    # ---- pools and ops ------------------------------------------------------------------

    def register(self, pool: Attachable) -> Target:
        """Remember ``pool`` (attached again on every reconnect) and attach it now."""
        self._pools[id(pool)] = pool
        try:
            conn = self.connection()
            with self._lock:
                target = self._targets.get(id(pool))  # attached by that connect already
                if target is None:
                    target = self._attach(conn, pool)
                    self._targets[id(pool)] = target
        except BaseException:
            self._pools.pop(id(pool), None)
            raise
        return target

    def unregister(self, pool: Attachable) -> None:
        self._pools.pop(id(pool), None)
        self._targets.pop(id(pool), None)

    def capabilities(self) -> frozenset[str]:
        return self.connection().capabilities

    def run(self, pool: Attachable, op: Callable[..., None], *args: Any, timeout: float) -> Any:
        """Run ``op(conn, target, *args, done)`` on the worker thread; its result, or raise.

        For :func:`~.ops.read` and :func:`~.ops.write`, ``args`` are ``(keys, pages, shape)``:
        the descriptor shaping travels with each op."""
        result = self.wait(self.start(pool, op, *args), timeout, op.__name__.strip("_"))
        if isinstance(result, Exception):
            raise result
        return result

    def wait(self, future: Future[Any], timeout: float, what: str) -> Any:
        """The result of a started op (an exception is returned, not raised)."""
        try:
            return self._wait(future, timeout, what)
        except TransportError as err:
            return err

    def start(self, pool: Attachable, op: Callable[..., None], *args: Any) -> Future[Any]:
        """Start ``op(conn, target, *args, done)`` on the worker thread; a future of its result
        (an exception instance when it failed; never raises)."""
        future: Future[Any] = Future()
        try:
            conn = self.connection()
            target = self._targets[id(pool)]
        except (TransportError, KeyError) as err:
            future.set_result(err if isinstance(err, TransportError) else TransportError(str(err)))
            return future

        def done(result: Any) -> None:
            if not future.done():
                future.set_result(result)

        def start() -> None:
            try:
                op(conn, target, *args, done)
            except Exception as err:
                done(err)

        self.worker.call(start)
        return future

    def request(self, pool: Attachable, make: Callable[[int], m.Message], timeout: float) -> Any:
        """One request/reply for ``pool`` (``make(pool number)`` builds it); the reply."""

        def op(conn: Connection, target: Target, done: Callable[[Any], None]) -> None:
            conn.request(make(target.number), lambda reply: done(error_of(reply, "") or reply))

        return self.run(pool, op, timeout=timeout)

    def progress(self) -> int:
        """A count that grows while the peer answers or bytes move (frames received and UCX
        messages or copies completed on the current connection, and each new connection)."""
        conn = self._conn
        if conn is None:
            return self.connects
        return self.connects + conn.channel.frames_in + conn.completions

    def describe(self) -> dict[str, Any]:
        conn = self._conn
        return {
            "peer": self.address,
            "tenant": self.tenant or None,
            "transport_used": conn.tls if conn is not None and conn.dead is None else None,
            "shared_memory": bool(conn is not None and conn.dead is None and conn.local),
            "connected": conn is not None and conn.dead is None,
            "connecting": self.connecting,
            "connects": self.connects,
            "capabilities": sorted(conn.capabilities) if conn is not None else [],
            "last_error": self._last_error or (conn.dead if conn is not None else None),
        }

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
        if conn is not None:
            self.worker.submit(lambda: conn.fail("client closed", expected=True)).result(10)
            deadline = time.monotonic() + 5.0
            while not conn.channel.closed and time.monotonic() < deadline:
                time.sleep(0.005)
