"""StoreClient: one ``MooncakeDistributedStore`` per backend, started within a bounded time.

Mooncake's own ``setup()`` blocks about 90 s when no master answers; this client first waits
at most ``connect_timeout_s`` for the master's RPC port to accept a connection, then runs
``setup()`` under the same deadline, and fails with an error naming the address and where it
was configured. Every call afterwards goes through :class:`~.health.Health`: while the master
is down it is not made at all.
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from kvcr_policy.plugin_api import PluginError, TransportError

from .codes import describe, is_master_down
from .health import Health
from .options import MooncakeOptions, split_address
from .priority import CallThreads

__all__ = ["INSTALL", "TCP_QUEUE_ENV", "StoreClient", "import_store"]

log = logging.getLogger("kvcr_policy_mooncake.client")

INSTALL = (
    "pip install mooncake-transfer-engine-non-cuda==0.3.13.post1 (on GPU hosts: "
    "mooncake-transfer-engine) and apt-get install libibverbs1, or from the kvcr_policy "
    "source tree: bash .ci/install-mooncake.sh"
)

#: Mooncake's tcp transport queues at most this many transfers (one per buffer) per peer, 1024
#: unless the variable says otherwise, and fails the ones beyond what also fits its admission
#: queue (QUEUE_FULL, reported as TRANSFER_FAIL). Calls in flight together stay within it.
TCP_QUEUE_ENV = "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER"

# The key the health probe asks about: never stored, so the query grants no lease.
_PROBE_KEY = "kvcr-policy/health-probe"


#: Mooncake's log level (TRACE, INFO, WARNING, ERROR), read when its library loads.
LOG_ENV = "MC_LOG_LEVEL"


def quiet_logs(native: bool) -> None:
    """Before Mooncake first loads in this process: its log lines on stderr are errors only
    unless ``native`` (``observability.native_logs``); an ``MC_LOG_LEVEL`` the environment sets
    wins. Child processes (segment holders) inherit it. A bench of the ``mooncake`` backend
    printed 64 glog lines per run, INFO mostly, with the level left alone."""
    if not native and "mooncake.store" not in sys.modules:
        os.environ.setdefault(LOG_ENV, "ERROR")


def import_store(native_logs: bool = False) -> tuple[Any, Any]:
    """``(MooncakeDistributedStore, ReplicateConfig)``, or a PluginError saying how to install."""
    quiet_logs(native_logs)
    try:
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    except ImportError as err:  # libibverbs.so.1 missing is an ImportError too
        message = f"backend 'mooncake' needs the Mooncake transfer engine ({err}): {INSTALL}"
        raise PluginError(message, plugin="mooncake", distribution="kvcr-policy-mooncake") from err
    return MooncakeDistributedStore, ReplicateConfig


def route_address(host: str, port: int) -> str:
    """This host's address on the route to ``host`` (no packet is sent: a UDP connect only
    picks the source address)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return str(probe.getsockname()[0])


def _view(address: int, nbytes: int) -> memoryview:
    """The ``nbytes`` bytes at ``address`` (pool memory), without a copy."""
    return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")


def _wait_for_master(address: tuple[str, int], deadline: float) -> str | None:
    """None once the master's RPC port accepts a connection before ``deadline``, else why not."""
    why = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return why
        try:
            with socket.create_connection(address, timeout=min(left, 2.0)):
                return None
        except OSError as err:
            why = err.strerror or type(err).__name__
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))


class StoreClient:
    """See the module docstring. ``origin(path)`` says where a config value came from."""

    def __init__(
        self,
        options: MooncakeOptions,
        origin: Callable[[str], str],
        native_logs: bool = False,
        calls: CallThreads | None = None,
    ) -> None:
        store_cls, replicate_cls = import_store(native_logs)
        self.options = options
        #: Where the batch calls run (:mod:`.priority`); unset: on the caller's thread.
        self.calls = calls or CallThreads("normal", 1)
        host, port = split_address(options.master)
        self.master = (host, port)
        timeout = options.connect_timeout_s
        deadline = time.monotonic() + timeout
        why = _wait_for_master(self.master, deadline)
        if why is not None:
            message = (
                f"Mooncake master {options.master} (backend.options.master, from "
                f"{origin('backend.options.master')}) did not answer within {timeout:g} s "
                f"({why}); start it (mooncake_master --rpc_address={host} --rpc_port={port}) or "
                f"point backend.options.master at it (backend.options.connect_timeout_s, from "
                f"{origin('backend.options.connect_timeout_s')}, bounds this wait)"
            )
            raise TransportError(message)
        hostname = options.local_hostname
        if hostname == "auto":
            hostname = route_address(host, port)
        self.store = store_cls()
        self._setup(hostname, deadline, origin)
        self.hostname: str = self.store.get_hostname()
        self.replicate = replicate_cls()
        self.replicate.replica_num = options.replicas
        preferred = options.preferred_segment
        if preferred is not None:
            self.replicate.preferred_segment = self.hostname if preferred == "local" else preferred
        self.health = Health(self.master, self.store.health_check, self._probe, options.recheck_s)
        self.queue = int(os.environ.get(TCP_QUEUE_ENV, "1024"))
        self._room = threading.Condition()
        self._queued = 0
        self._closed = False

    def _setup(self, hostname: str, deadline: float, origin: Callable[[str], str]) -> None:
        o = self.options
        result: list[Any] = []

        def run() -> None:
            try:
                result.append(
                    self.store.setup(
                        hostname,
                        o.metadata,
                        int(o.segment_bytes),
                        int(o.buffer_bytes),
                        o.protocol,
                        o.device,
                        o.master,
                        tenant_id=o.tenant,
                    )
                )
            except Exception as err:  # reported below, on the caller's thread
                result.append(err)

        # setup() cannot be interrupted: past the deadline the thread is left to finish alone.
        worker = threading.Thread(target=run, name="kvcr-mooncake-setup", daemon=True)
        worker.start()
        worker.join(max(1.0, deadline - time.monotonic()))
        where = f"backend.options.master from {origin('backend.options.master')}"
        if not result:
            message = (
                f"Mooncake setup() with master {o.master} ({where}) did not finish within "
                f"{o.connect_timeout_s:g} s although the master accepts connections; check "
                "that it is a mooncake_master RPC port, not its metrics port"
            )
            raise TransportError(message)
        code = result[0]
        if isinstance(code, Exception) or code != 0:
            got = code if isinstance(code, Exception) else describe(int(code))
            message = (
                f"Mooncake setup() failed ({got}) as {hostname!r} with master {o.master} "
                f"({where}), protocol {o.protocol!r}, metadata {o.metadata!r}, segment "
                f"{int(o.segment_bytes)} bytes; the client's log lines above say why"
            )
            raise TransportError(message)

    def _probe(self) -> bool:
        codes = self.store.batch_is_exist([_PROBE_KEY])
        return bool(codes) and int(codes[0]) >= 0

    # ---- calls -------------------------------------------------------------------------------

    def _checked(self, codes: Sequence[int]) -> list[int]:
        out = [int(c) for c in codes]
        down = next((c for c in out if is_master_down(c)), None)
        if down is not None:
            self.health.trip(f"a call returned {describe(down)}")
        return out

    def exists(self, keys: list[str]) -> list[int]:
        return self._checked(self.store.batch_is_exist(keys))

    @contextmanager
    def _admitted(self, ptrs: list[Any], multi: bool) -> Iterator[None]:
        """Wait until this call's transfers (one per buffer) fit the transport's queue beside
        the calls already in flight."""
        need = min(self.queue, sum(map(len, ptrs)) if multi else len(ptrs))
        with self._room:
            self._room.wait_for(lambda: self._queued + need <= self.queue)
            self._queued += need
        try:
            yield
        finally:
            with self._room:
                self._queued -= need
                self._room.notify_all()

    def put(self, keys: list[str], ptrs: list[Any], sizes: list[Any], multi: bool) -> list[int]:
        store = self.store
        call = store.batch_put_from_multi_buffers if multi else store.batch_put_from
        with self._admitted(ptrs, multi):
            codes = self.calls.call(call, keys, ptrs, sizes, self.replicate)
        return self._checked(codes)

    def get(self, keys: list[str], ptrs: list[Any], sizes: list[Any], multi: bool) -> list[int]:
        store = self.store
        call = store.batch_get_into_multi_buffers if multi else store.batch_get_into
        with self._admitted(ptrs, multi):
            codes = self.calls.call(call, keys, ptrs, sizes)
        return self._checked(codes)

    def upsert(self, keys: list[str], ptrs: list[Any], sizes: list[Any], multi: bool) -> list[int]:
        """Insert or replace ``keys`` (an object left unfinished by a writer that died is
        replaced): ``batch_upsert_from`` from registered memory, or for pages of several
        buffers one ``upsert_parts`` each (no batch form takes several buffers a key; it copies
        through the client's buffer, which is why puts never use it)."""
        store = self.store
        with self._admitted(ptrs, multi):
            if not multi:
                return self._checked(store.batch_upsert_from(keys, ptrs, sizes, self.replicate))
            codes = []
            for key, pointers, lengths in zip(keys, ptrs, sizes, strict=True):
                parts = [_view(p, n) for p, n in zip(pointers, lengths, strict=True)]
                codes.append(store.upsert_parts(key, *parts, config=self.replicate))
        return self._checked(codes)

    def remove(self, keys: list[str], force: bool = False) -> list[int]:
        return self._checked(self.store.batch_remove(keys, force))

    def remove_matching(self, pattern: str) -> int:
        """Remove every object whose key matches ``pattern``, leases or not (a flush)."""
        removed = int(self.store.remove_by_regex(pattern, True))
        if removed < 0:
            self._checked([removed])
            raise TransportError(f"Mooncake remove_by_regex failed: {describe(removed)}")
        return removed

    def register(self, address: int, nbytes: int) -> int:
        return int(self.store.register_buffer(address, nbytes))

    def unregister(self, address: int) -> int:
        return int(self.store.unregister_buffer(address))

    def describe(self) -> dict[str, Any]:
        o = self.options
        return {
            "master": o.master,
            "hostname": self.hostname,
            "protocol": o.protocol,
            "metadata": o.metadata,
            "segment_bytes": int(o.segment_bytes),
            # the memory this process gives the store (its segment): stats().memory counts it
            "tier_bytes": int(o.segment_bytes),
            "replicas": o.replicas,
            "preferred_segment": self.replicate.preferred_segment or None,
            "tenant": o.tenant,
            "health": self.health.snapshot(),
        }

    def close(self) -> None:
        """Stop the watcher, then the client (its segment leaves the store with it)."""
        if self._closed:
            return
        self._closed = True
        self.health.stop()
        code = int(self.store.close())
        if code != 0:
            log.warning("Mooncake client %s closed with %s", self.hostname, describe(code))
