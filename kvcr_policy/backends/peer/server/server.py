"""PeerServer: a tier exposed to peers (``kvcr-policy serve``, or in-process for tests).

The control socket binds loopback unless an address is given; each accepted connection is a
:class:`~.session.Session`. Data moves over UCX: shared memory with clients
on the same host (endpoints created from exchanged worker addresses, without endpoint error
handling, so liveness is the control socket, heartbeats and operation deadlines), tcp with
error handling otherwise; ``transport.options.tls`` can force either.

:meth:`stop` (SIGTERM in ``serve``) stops accepting, lets in-flight transfers finish for up to
``op_timeout_s``, ends the remaining sessions (releasing every claim and aborting every
reservation once UCX lets go of the slots), then closes the tiers.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvcr_policy.errors import ClosedError, KVCRPolicyError, UnsupportedError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.loading import LoadedConfig, load_config
from kvcr_policy.observability.peer_server import ServerMeter, open_server_meter
from kvcr_policy.plugins import make_plugin_manager

from ..host import host_id
from ..options import UcxOptions, is_loopback, parse_address
from ..wire import messages as m
from ..worker import Worker, acquire_worker
from .addrcheck import AddressChecker
from .session import REQUEST_KINDS, Session
from .tiers import Tiers

__all__ = ["PeerServer", "server_options"]

log = logging.getLogger("kvcr_policy.backends.peer.server")

MAX_SESSIONS = 256


def server_options(loaded: LoadedConfig) -> UcxOptions:
    """The ucx options of a config (schema defaults when its transport is not ``ucx``)."""
    transport = loaded.config.transport
    return UcxOptions.model_validate(transport.options if transport.name == "ucx" else {})


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
        self.options = options or server_options(self.loaded)
        self.host, self.port = parse_address(listen or self.options.listen, where="--listen")
        self.op_timeout_s = config.transport.op_timeout_s
        self.linger_s = min(self.op_timeout_s, 10.0)
        # Descriptor shapes accepted; every server accepts client-shaped lists ("shaped").
        self.capabilities: frozenset[str] = frozenset(self.options.capabilities)
        self.capabilities_mask = m.capability_mask(self.capabilities | {"shaped"})
        self.server_id = secrets.randbits(64)
        self.host_id = host_id()
        registry = self.loaded.registry or make_plugin_manager(config).registry
        spec = registry.get("placement", config.placement.strategy)
        self._placement = spec.create(config.placement, options=config.placement.options)
        self.worker: Worker = None  # type: ignore[assignment]
        self.tiers: Tiers = None  # type: ignore[assignment]
        self.sessions: set[Session] = set()
        self._settling: set[Session] = set()  # closed, but UCX requests still completing
        self.address = ""
        self.state = "new"
        self._listener: socket.socket | None = None
        self._checker: AddressChecker | None = None
        profile = Path(self.loaded.profile).stem if self.loaded.profile else "default"
        self.meter: ServerMeter | None = open_server_meter(
            config.observability.metrics, profile, REQUEST_KINDS
        )

    # ---- lifetime -------------------------------------------------------------------------

    def start(self) -> PeerServer:
        if self.state != "new":
            raise ClosedError(f"peer server is {self.state}; build a new one")
        listener = socket.create_server((self.host, self.port), backlog=64)
        listener.setblocking(False)
        self.port = listener.getsockname()[1]
        self.address = f"{self.host}:{self.port}"
        self._listener = listener
        try:
            self.worker = acquire_worker(self.options)
        except BaseException:
            listener.close()
            raise
        capacity = int(self.loaded.config.placement.capacity_bytes)
        self.tiers = Tiers(self._placement, capacity, self.options.max_tiers)
        if self.options.check_addresses:
            self._checker = AddressChecker()
        self._opener = ThreadPoolExecutor(1, thread_name_prefix="kvcr-tier-open")
        self.worker.submit(self.worker.watch, listener, self._accept, False).result()
        self.state = "open"
        log.info(
            "kvcr-policy peer listening on %s (pid %d, tls %s, progress %s, capabilities %s, "
            "op timeout %s s)",
            self.address,
            os.getpid(),
            self.options.tls,
            self.worker.progress_mode,
            ",".join(sorted(self.capabilities)) or "none",
            self.op_timeout_s,
        )
        if not is_loopback(self.host):
            log.warning(
                "listening on %s, not loopback: any host that reaches this port can read and "
                "write the tier (there is no authentication)",
                self.address,
            )
        return self

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
        if self._listener is not None:
            self.worker.unwatch(self._listener)
            self._listener.close()
            self._listener = None
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
            name = f"{peer[0]}:{peer[1]}"
            if len(self.sessions) >= MAX_SESSIONS:
                log.warning("refusing %s: %d sessions already", name, len(self.sessions))
                sock.close()
                continue
            self.sessions.add(Session(self, sock, name))
            if self.meter is not None:
                self.meter.connected()

    def session_closed(self, session: Session, reason: str) -> None:
        if session in self.sessions and self.meter is not None:
            self.meter.disconnected()
        self.sessions.discard(session)
        self._settling = {s for s in self._settling if s.groups}
        if session.groups:
            self._settling.add(session)
        log.info("client %s disconnected: %s", session.peer, reason)

    def choose_tls(self, hello: m.Hello) -> str:
        wanted = ("auto", "sm", "tcp")[hello.tls]
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
        self, address: bytes, error_handling: bool, then: Callable[[bool], Any]
    ) -> None:
        if self._checker is None:
            self.worker.call(then, True)
            return
        future = self._checker.check(address, error_handling)

        def report(f: Any) -> None:
            ok = not f.cancelled() and f.exception() is None and bool(f.result())
            self.worker.call(then, ok)

        future.add_done_callback(report)

    def open_tier(self, geometry: PoolGeometry, align: int, then: Callable[[Any], Any]) -> None:
        """``then(tier or exception)`` on the worker thread; opening a tier (pre-faulting GiBs)
        runs on a helper thread, so the worker keeps answering meanwhile."""
        tier = self.tiers.find(geometry)
        if tier is not None:
            then(tier)
            return

        def run() -> None:
            try:
                result: Any = self.tiers.open(geometry, align)
            except Exception as err:  # refused (capacity, placement): the client is told
                if not isinstance(err, KVCRPolicyError):
                    log.exception("opening tier %r failed", geometry.name)
                result = err
            self.worker.call(then, result)

        self._opener.submit(run)

    def describe(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "server_id": self.server_id,
            "tls": self.options.tls,
            "progress_mode": self.worker.progress_mode if self.worker else None,
            "capabilities": sorted(self.capabilities),
            "sessions": len(self.sessions),
            "op_timeout_s": self.op_timeout_s,
            "env": self.worker.env.to_dict() if self.worker else None,
        }
