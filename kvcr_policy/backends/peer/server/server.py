"""PeerServer: a tier exposed to peers (``kvcr-policy serve``, or in-process for tests).

The control socket binds loopback unless an address is given; each accepted connection is a
:class:`~.session.Session`, which must authenticate as one of the server's tenants
(:mod:`..credentials`) before it reaches anything; :mod:`.admission` bounds handshakes,
sessions and buffered bytes. The UCX worker listens only where the control socket does
(``UCX_NET_DEVICES`` follows ``--listen`` unless ``transport.options.net_devices`` or the
environment says otherwise). Data moves over UCX: shared memory with clients
on the same host (endpoints created from exchanged worker addresses, without endpoint error
handling, so liveness is the control socket, heartbeats and operation deadlines), tcp with
error handling otherwise; ``transport.options.tls`` can force either.

**Same host, shared memory.** Beside its TCP socket the server listens on a Unix socket of the
abstract namespace (``transport.options.shared_memory``, on unless ``off``), whose name it
tells a client on the same host in WELCOME; ``--listen unix:PATH`` makes it listen there only
(no TCP, no UCX: the host tier of :mod:`kvcr_policy.backends.peer.host`). A session on that
socket authenticates as any other, then maps each tier it attaches (the server passes the
tier's memfd) and moves pages by memory copy, keeping claims and reservations here
(:mod:`.transfers`); its client's process is named by ``SO_PEERCRED``.

:meth:`stop` (SIGTERM in ``serve``) stops accepting, lets in-flight transfers finish for up to
``op_timeout_s``, ends the remaining sessions (releasing every claim and aborting every
reservation once UCX lets go of the slots), then closes the tiers.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import socket
import stat
import struct
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvcr_policy.config.loading import LoadedConfig, load_config
from kvcr_policy.config.schema import strategy_name
from kvcr_policy.errors import (
    ArgumentError,
    ClosedError,
    KVCRPolicyError,
    TransportError,
    UnsupportedError,
)
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.memory import linux as _os
from kvcr_policy.plugins import make_plugin_manager

from ..credentials import Keyring, server_keyring
from ..host import host_id, interface_of
from ..options import UcxOptions, is_loopback, parse_address, unix_address
from ..wire import messages as m
from ..worker import Worker, acquire_worker
from .addrcheck import READY_TIMEOUT_S, AddressChecker
from .admission import Admission
from .bandwidth import TenantBandwidth
from .labels import tenant_labels
from .meter import ServerMeter, open_server_meter
from .quarantine import Held, Quarantine, open_pidfd
from .session import CHECK_TIMEOUT_S, REQUEST_KINDS, LocalPeer, Session
from .tiers import Tiers

__all__ = ["PeerServer", "server_options"]

log = logging.getLogger("kvcr_policy.backends.peer.server")

#: Allocations from this size up are mapped on their own and returned to the OS when freed.
#: glibc otherwise raises its threshold after each large free (up to 32 MiB), and frames of a
#: few MiB then stay in the heap once freed: measured, 256 connections x 16 MiB left 8.6 GiB
#: resident.
_MMAP_THRESHOLD = 256 << 10


def _bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port``, not yet listening (connects are refused until
    :meth:`PeerServer.start` is ready to serve them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _bind_unix(address: str) -> socket.socket:
    """A Unix socket bound to ``address`` (a path, or ``"\\0NAME"``), closed to other users
    (mode 0600; an abstract one has no mode: the handshake is its only guard). A stale socket
    file that nobody listens on is replaced; a live one is EADDRINUSE."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if not address.startswith("\0"):
            _remove_stale(address)
        old = os.umask(0o177)
        try:
            sock.bind(address)
        finally:
            os.umask(old)
    except BaseException:
        sock.close()
        raise
    return sock


def _remove_stale(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)  # a socket file left by a server that is gone
        return
    except OSError:
        return
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, f"a server listens on {path}")


def _shown(address: str) -> str:
    """``unix:PATH`` or ``unix:@NAME`` of a Unix socket address."""
    return "unix:" + ("@" + address[1:] if address.startswith("\0") else address)


def _peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket (unix(7) SO_PEERCRED:
    struct ucred is pid, uid, gid as three ints)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


def server_options(loaded: LoadedConfig) -> UcxOptions:
    """The ucx options of a config (schema defaults when its transport is not ``ucx``)."""
    transport = loaded.config.transport
    return UcxOptions.model_validate(transport.options if transport.name == "ucx" else {})


def _listen_devices(host: str, options: UcxOptions) -> UcxOptions:
    """``options`` with ``net_devices`` naming the interface of ``host`` when nothing else
    names one (a wildcard address keeps every interface)."""
    if options.net_devices is not None or "UCX_NET_DEVICES" in os.environ:
        return options
    device = interface_of(host)
    return options if device is None else options.model_copy(update={"net_devices": device})


class PeerServer:
    """See the module docstring. ``listen`` is ``HOST:PORT`` (port 0 picks a free one)."""

    def __init__(
        self,
        loaded: LoadedConfig | None = None,
        *,
        listen: str | None = None,
        options: UcxOptions | None = None,
    ) -> None:
        self.loaded = loaded or load_config()
        config = self.loaded.config
        security = config.security
        options = options or server_options(self.loaded)
        try:
            text = listen or options.listen
            self.unix = unix_address(text, where="--listen")
            if self.unix is None:
                self.host, self.port = parse_address(text, where="--listen")
            else:
                self.host, self.port = "localhost", 0
        except ValueError as err:
            raise ArgumentError(str(err)) from None
        if security.insecure and not is_loopback(self.host):
            message = (
                f"--listen {self.host}: security.insecure (serve --insecure) refuses any address "
                "but loopback (127.0.0.1, ::1): without authentication anyone who reaches the "
                "port could read and write the tier; configure a secret instead"
            )
            raise ArgumentError(message)
        self.options = _listen_devices(self.host, options)
        self.op_timeout_s = config.transport.op_timeout_s
        self.linger_s = min(self.op_timeout_s, 10.0)
        self.handshake_timeout_s = security.handshake_timeout_s
        self.idle_timeout_s = security.idle_timeout_s
        self.dead_after_s = self.options.dead_after_s
        self.keyring: Keyring = server_keyring(self.loaded)
        self.admission = Admission(security.tenant_max_sessions)
        rate = None if security.tenant_rate is None else security.tenant_rate * 1e9
        self.bandwidth = TenantBandwidth(rate)  # security.tenant_rate: opt-in, per tenant
        # Descriptor shapes accepted; every server accepts client-shaped lists ("shaped").
        self.capabilities: frozenset[str] = frozenset(self.options.capabilities)
        self.capabilities_mask = m.capability_mask(self.capabilities | {"shaped"})
        self.server_id = secrets.randbits(64)
        self.host_id = host_id()
        registry = self.loaded.registry or make_plugin_manager(config).registry
        spec = registry.get("placement", config.placement.strategy)
        self._placement = spec.create(config.placement, options=config.placement.options)
        evicts = registry.get("eviction", strategy_name(config, "eviction"))
        self._eviction = evicts.create(config.eviction, options=config.eviction.options)
        self.worker: Worker = None  # type: ignore[assignment]
        self.tiers: Tiers = None  # type: ignore[assignment]
        self.sessions: set[Session] = set()
        self._settling: set[Session] = set()  # closed, but UCX requests still completing
        self.address = ""
        self.state = "new"
        self._listener: socket.socket | None = None
        self._local: socket.socket | None = None  # the Unix socket of shared-memory sessions
        self.local_name = ""  # its name as clients write it (unix:@NAME), "" when none
        self._abstract = f"\0kvcr-policy-{self.server_id:016x}"
        self.quarantine: Quarantine | None = None
        self._checker: AddressChecker | None = None
        profile = Path(self.loaded.profile).stem if self.loaded.profile else "default"
        self.meter: ServerMeter | None = open_server_meter(
            config.observability.metrics, profile, REQUEST_KINDS
        )

    # ---- lifetime -------------------------------------------------------------------------

    def _listen(self) -> tuple[socket.socket | None, socket.socket | None]:
        """The TCP listener (None for ``unix:`` only) and the Unix one (None when off)."""
        tcp = local = None
        where = _shown(self.unix) if self.unix is not None else f"{self.host}:{self.port}"
        try:
            if self.unix is not None:
                local = _bind_unix(self.unix)
                return None, local
            tcp = _bind(self.host, self.port)
            if self.options.shared_memory != "off":
                where = f"the abstract Unix socket @{self._abstract[1:]}"
                local = _bind_unix(self._abstract)
        except OSError as err:
            for sock in (tcp, local):
                if sock is not None:
                    sock.close()
            message = f"cannot listen on {where}: {err.strerror or err}"
            if err.errno == errno.EADDRINUSE:
                message += " (another process holds it: pick another port, or 0 for any)"
            raise TransportError(message) from None
        return tcp, local

    def start(self) -> PeerServer:
        if self.state != "new":
            raise ClosedError(f"peer server is {self.state}; build a new one")
        listener, local = self._listen()
        _os.limit_heap_retention(_MMAP_THRESHOLD)
        for sock in (listener, local):
            if sock is not None:
                sock.setblocking(False)
        if listener is not None:
            self.port = listener.getsockname()[1]
            self.address = f"{self.host}:{self.port}"
        if local is not None:
            self.local_name = _shown(self._abstract if self.unix is None else self.unix)
            self.address = self.address or self.local_name
        self._listener, self._local = listener, local

        def close_listeners() -> None:
            for sock in (listener, local):
                if sock is not None:
                    sock.close()

        try:
            self.worker = acquire_worker(self.options, ucx=listener is not None)
        except BaseException:
            close_listeners()
            raise
        self.quarantine = Quarantine(self.worker)
        capacity = int(self.loaded.config.placement.capacity_bytes)
        quota = self.loaded.config.security.tenant_quota_bytes
        observability = self.loaded.config.observability
        labels = tenant_labels(
            self.keyring,
            self.loaded.config.security.tenants_dir is not None,
            observability.tenant_labels,
        )
        self.tiers = Tiers(
            self._placement,
            capacity,
            self.options.max_tiers,
            None if quota is None else int(quota),
            self._eviction,
            labels,
            self.loaded.config.placement.eviction,
        )
        if self.options.check_addresses and listener is not None:
            self._checker = AddressChecker()
            try:
                self._probe_checker()
            except BaseException:
                self._checker.close()
                self.worker.release()
                close_listeners()
                raise
        self._opener = ThreadPoolExecutor(1, thread_name_prefix="kvcr-tier-open")
        # Connections are accepted only now that a client can be served at once: one that
        # connected earlier would spend its handshake time waiting for the checker to start.
        for sock, accept in ((listener, self._accept), (local, self._accept_local)):
            if sock is not None:
                sock.listen(64)
                self.worker.submit(self.worker.watch, sock, accept, False).result()
        self.state = "open"
        log.info(
            "kvcr-policy peer listening on %s (shared memory %s; pid %d, tls %s, progress %s, "
            "capabilities %s, op timeout %s s, UCX devices %s, secret from %s, tenants %s)",
            self.address,
            self.local_name or "off",
            os.getpid(),
            self.options.tls,
            self.worker.progress_mode,
            ",".join(sorted(self.capabilities)) or "none",
            self.op_timeout_s,
            os.environ.get("UCX_NET_DEVICES", "all"),
            self.keyring.source,
            ", ".join(self.keyring.names()),
        )
        if self.keyring.insecure:
            log.warning(
                "INSECURE: no authentication on %s; any process that reaches it can read, "
                "overwrite and delete every page (security.insecure / serve --insecure)",
                self.address,
            )
        elif not is_loopback(self.host):
            log.warning(
                "listening on %s, not loopback: control traffic and pages cross the network "
                "unencrypted; run it only on a network you trust",
                self.address,
            )
        return self

    def _probe_checker(self) -> None:
        """Check this process's own UCX worker address: proves the address checker's helper
        is up (it imports ucxx, seconds on a busy host) before any client waits for it."""
        assert self._checker is not None
        link = self.worker.submit(self.worker.open_link, "address checker probe").result()
        # The helper's start (importing ucxx) has its own limit, then the check its own: the
        # probe waits for both (a busy host makes the start slow, never the server fail).
        limit = READY_TIMEOUT_S + CHECK_TIMEOUT_S
        ok: bool | Exception
        try:
            ok = self._checker.check(link.address, False).result(limit)
        except Exception as err:
            ok = err
        finally:
            self.worker.call(link.retire, 0.0)
        if ok is not True:
            message = (
                f"the UCX address checker did not pass a check of this server's own worker "
                f"address within {limit:g} s ({ok!r}); run with "
                "transport.options.check_addresses = false only where every client is trusted"
            )
            raise TransportError(message)

    def __enter__(self) -> PeerServer:
        return self if self.state == "open" else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, grace_s: float | None = None) -> None:
        """Stop serving (see the module docstring); idempotent, any thread but the worker's."""
        if self.state != "open":
            return
        self.state = "stopping"
        grace = self.op_timeout_s if grace_s is None else grace_s
        log.info("stopping: finishing in-flight requests for up to %.1f s", grace)
        self.worker.submit(self._begin_stop).result()
        if not self._wait_sessions(grace):
            self.worker.submit(self._abort_all).result()
            if not self._wait_sessions(self.linger_s + 1.0):
                self.worker.submit(self._close_all).result()
                self._wait_sessions(2.0)
        self._wait_groups(5.0)
        self._opener.shutdown(wait=True)
        if self.quarantine is not None:
            self.worker.submit(self.quarantine.close).result()
        leaked = self.worker.submit(self.tiers.close).result()
        if leaked:
            log.warning("tiers %s stay mapped: a transfer may still touch them", leaked)
        if self._checker is not None:
            self._checker.close()
        if self.meter is not None:
            self.meter.close()
        self.worker.release()
        self.state = "closed"
        log.info("stopped")

    def _begin_stop(self) -> None:
        for sock in (self._listener, self._local):
            if sock is not None:
                self.worker.unwatch(sock)
                sock.close()
        self._listener = self._local = None
        if self.unix is not None and not self.unix.startswith("\0"):
            with contextlib.suppress(OSError):
                os.unlink(self.unix)
        for session in list(self.sessions):
            session.drain()

    def _abort_all(self) -> None:
        for session in list(self.sessions):
            session.abort(m.Err.SHUTTING_DOWN, "the peer is shutting down")

    def _close_all(self) -> None:
        for session in list(self.sessions):
            session.channel.close("the peer is shutting down")

    def _wait_sessions(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.worker.submit(lambda: len(self.sessions)).result():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def _wait_groups(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.worker.submit(lambda: sum(s.groups for s in self._settling)).result():
            if time.monotonic() > deadline:
                log.warning("UCX requests still pending after %.1f s", timeout)
                return
            time.sleep(0.02)

    # ---- worker thread --------------------------------------------------------------------

    def _accept(self, mask: int) -> None:
        while self._listener is not None:
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.warning("accept failed: %s", err)
                return
            while (victim := self.admission.victim(peer[0])) is not None:
                channel = victim.channel
                channel.pump()  # its HELLO may be waiting: then it moves up, maybe not out
                if self.admission.victim(peer[0]) is victim:
                    self.admission.refused("handshake slots full: dropped the oldest handshake")
                    channel.close("handshake slots full: the oldest handshake is dropped")
            session = Session(self, sock, f"{peer[0]}:{peer[1]}")
            self.sessions.add(session)
            self.admission.arrived(session, peer[0])
            if self.meter is not None:
                self.meter.connected()

    def _accept_local(self, mask: int) -> None:
        """A same-host client on the Unix socket: its session moves pages by memory copy."""
        while self._local is not None:
            try:
                sock, _ = self._local.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.warning("accept failed: %s", err)
                return
            try:
                pid, uid = _peer_credentials(sock)
            except OSError as err:
                log.warning("a local client without credentials (%s): dropped", err)
                sock.close()
                continue
            slot = f"local uid {uid}"  # handshake slots are shared per user, as per address
            while (victim := self.admission.victim(slot)) is not None:
                channel = victim.channel
                channel.pump()
                if self.admission.victim(slot) is victim:
                    self.admission.refused("handshake slots full: dropped the oldest handshake")
                    channel.close("handshake slots full: the oldest handshake is dropped")
            peer = LocalPeer(pid, uid, open_pidfd(pid))
            session = Session(self, sock, f"local pid {pid} uid {uid}", local=peer)
            self.sessions.add(session)
            self.admission.arrived(session, slot)
            if self.meter is not None:
                self.meter.connected()

    def hold(self, pidfd: int | None, items: list[Held], who: str) -> None:
        """Reservations a shared-memory client may still write (see .quarantine)."""
        assert self.quarantine is not None
        self.quarantine.hold(pidfd, items, who)

    def session_closed(self, session: Session, reason: str) -> None:
        if session in self.sessions and self.meter is not None:
            self.meter.disconnected()
        self.admission.left(session)
        self.sessions.discard(session)
        self._settling = {s for s in self._settling if s.groups}
        if session.groups:
            self._settling.add(session)
        log.info("client %s disconnected: %s", session.peer, reason)

    def choose_tls(self, hello: m.Hello, local: bool) -> str:
        wanted = ("auto", "sm", "tcp", "shm")[hello.tls]
        if local:
            if wanted not in ("auto", "shm"):
                text = f"this socket serves shared-memory sessions only; the client asks {wanted!r}"
                raise UnsupportedError(text)
            return "shm"
        if wanted == "shm":
            raise UnsupportedError("tls 'shm' is served on this peer's Unix socket only")
        ours = self.options.tls
        same_host = hello.host_id == self.host_id
        if {wanted, ours} == {"sm", "tcp"}:
            raise UnsupportedError(f"the client asks for tls {wanted!r}, this peer runs {ours!r}")
        if "sm" in (wanted, ours):
            if not same_host:
                raise UnsupportedError("tls 'sm' needs both peers on one host (and namespace)")
            return "sm"
        if "tcp" in (wanted, ours):
            return "tcp"
        return "sm" if same_host else "tcp"

    def check_address(
        self,
        address: bytes,
        error_handling: bool,
        tenant: str,
        wanted: Callable[[], bool],
        then: Callable[[bool | Exception], Any],
    ) -> None:
        """``then(ok)`` on the worker thread once ``address`` was checked (see
        :mod:`.addrcheck`); ``then(CapacityError)`` when ``tenant`` has too many waiting."""
        if self._checker is None:
            self.worker.call(then, True)
            return
        future = self._checker.check(address, error_handling, tenant, wanted)

        def report(f: Any) -> None:
            if f.cancelled():
                result: bool | Exception = False
            else:
                result = f.exception() or bool(f.result())
            self.worker.call(then, result)

        future.add_done_callback(report)

    def open_tier(
        self, tenant: str, geometry: PoolGeometry, align: int, then: Callable[[Any], Any]
    ) -> None:
        """``then(tier or exception)`` on the worker thread; opening a tier (pre-faulting GiBs)
        runs on a helper thread, so the worker keeps answering meanwhile."""
        tier = self.tiers.find(tenant, geometry)
        if tier is not None:
            then(tier)
            return

        def run() -> None:
            try:
                result: Any = self.tiers.open(tenant, geometry, align)
            except Exception as err:  # refused (capacity, placement): the client is told
                if not isinstance(err, KVCRPolicyError):
                    log.exception("opening tier %r failed", geometry.name)
                result = err
            if self.meter is not None and not isinstance(result, Exception):
                self.meter.tier(result)  # its gauges exist, and follow its store, from now
            self.worker.call(then, result)

        self._opener.submit(run)

    def describe(self, tenant: str | None = None, admin: bool = True) -> dict[str, Any]:
        """What ``serve`` prints, or what a tenant's STATS may see: its own sessions and
        tiers; an admin tenant (``security.admin_tenants``) also every tenant's counts."""
        data: dict[str, Any] = {
            "address": self.address,
            "local": self.local_name or None,
            "server_id": self.server_id,
            "tls": self.options.tls,
            "progress_mode": self.worker.progress_mode if self.worker else None,
            "capabilities": sorted(self.capabilities),
            "op_timeout_s": self.op_timeout_s,
            "insecure": self.keyring.insecure,
            "quarantined_slots": self.quarantine.slots if self.quarantine else 0,
        }
        if tenant is not None:
            mine = [tier.store.stats() for tier in self.tiers.of(tenant)] if self.tiers else []
            data["tenant"] = tenant
            data["tenant_sessions"] = self.admission.tenant_sessions(tenant)
            # Bytes of the tenant's frames buffered now, and the most it may buffer while the
            # tenants holding some ask for theirs (see .admission).
            data["tenant_buffered"] = self.admission.budget.held(tenant)
            data["tenant_buffer_share"] = self.admission.budget.share(tenant)
            data["tenant_tiers"] = len(mine)
            data["tenant_claimed"] = sum(s.claimed for s in mine)
            data["tenant_reserved"] = sum(s.reserved for s in mine)
            # Writes whose receives are posted into reserved slots right now.
            data["tenant_receiving"] = sum(
                session.transfers.receiving
                for session in (*self.sessions, *self._settling)
                if session.tenant == tenant
            )
        if admin:
            data["sessions"] = self.admission.sessions
            data["handshakes"] = self.admission.handshakes
            data["buffered"] = self.admission.budget.total
            data["tenants"] = self.keyring.names()
            data["tiers_by_tenant"] = self.tiers.by_tenant() if self.tiers else {}
            data["env"] = self.worker.env.to_dict() if self.worker else None
            data["links"] = self.worker.describe() if self.worker else None
        return data
