"""The ``kvcr`` backend: each pool's pages in a KVCR runner (``kvcr`` 0.1.1), memory we place.

Per pool, the configured placement strategy opens a process-owned region of
``placement.capacity_bytes`` (whole pages; pre-fault, huge-page advice and NUMA policy as the
profile asks, audited), and a KVCR runner starts with that region as its local DRAM pool
(``LocalDramOptions``), the pool's buffer as its framework registration, KVCR's own LRU or FIFO
policy as ``eviction.strategy`` names it (``lru`` or ``fifo``), ``transport.op_timeout_s`` as
its operation timeout, and optionally a G3 file tier. Bytes move with NIXL over UCX, inside
KVCR. One runner per pool: KVCR learns its pools when it starts, and the pipeline attaches pools
one by one.

KVCR 0.1.1 takes whole elements only (no coalescing, no split sizing), so this backend declares
neither: ``coalescing.on_unsupported`` decides between an error naming the option and plain
descriptors. Close order, per pool: wait for KVCR's operations, release claims, close KVCR,
and only then unmap the region (kept mapped if KVCR could not stop).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from importlib import metadata
from pathlib import Path
from typing import Any

from kvcr.config import G3Options
from kvcr.types import RegionDescriptor

from kvcr_policy.plugin_api import (
    BackendContext,
    ClosedError,
    PoolError,
    PoolSpec,
    Region,
    check_device,
    mismatch,
    stages_pages,
    strategy_name,
)

from .layout import PageLayout, kvcr_pool_name
from .options import KvcrOptions, resolved_staging
from .policy import POLICIES
from .pool import KvcrPool, kept
from .process import ProcessReport, apply_process_defaults, free_port, port_free
from .staging import Staging
from .startup import Retained, Started, StartFailed, start_runner

__all__ = ["KvcrBackend"]

log = logging.getLogger("kvcr_policy_kvcr.backend")

#: Threads of a staged pool where no window bounds the batches in flight.
STAGING_THREADS = 4
#: The most threads of a staged pool (each holds at most one KVCR call at a time).
MAX_STAGING_THREADS = 16


class KvcrBackend:
    """The ``kvcr`` tier backend; see the module docstring."""

    name = "kvcr"
    capabilities: frozenset[str] = frozenset()
    devices = frozenset({"cpu"})

    def __init__(self, context: BackendContext, options: KvcrOptions) -> None:
        self.options = options
        self.loaded = context.loaded
        self.config = context.config
        self.placement = context.placement
        self.eviction = strategy_name(self.config, "eviction")
        if self.eviction not in POLICIES:
            message = (
                f"backend 'kvcr' runs KVCR's own eviction policies ({', '.join(POLICIES)}); "
                f"eviction.strategy is {self.eviction!r}: choose one of those"
            )
            raise mismatch("eviction.strategy", self.loaded.origin("eviction.strategy"), message)
        self.process: ProcessReport = apply_process_defaults(options, self.loaded.origins)
        coalescing = strategy_name(self.config, "coalescing")  # what with_coalescing follows
        self.staging = resolved_staging(options, coalescing)
        self.staging_source = self._origin("staging")
        if options.staging == "with_coalescing":
            self.staging_source += (
                f": with_coalescing -> {self.staging} (coalescing.strategy = {coalescing!r}, "
                f"from {self.loaded.origin('coalescing.strategy')})"
            )
        self._pools: dict[str, KvcrPool] = {}
        self._ports: dict[str, tuple[int, str]] = {}
        self._lock = threading.Lock()
        self._closed = False

    # ---- pools ----------------------------------------------------------------------------

    def _origin(self, option: str) -> str:
        path = f"backend.options.{option}"
        return f"{path} (from {self.loaded.origins.get(path, 'default')})"

    def _port(self, name: str) -> tuple[int, str]:
        port = self.options.listen_port
        if port is None:
            return free_port(), "chosen free (backend.options.listen_port unset)"
        taken = [pool for pool, (p, _) in self._ports.items() if p == port]
        if taken or not port_free(port):
            problem = (
                f"already serves pool {taken[0]!r}, and each pool's KVCR runner needs its own "
                "listener; unset listen_port to choose a free port per pool"
                if taken
                else "is in use on this host (NIXL's listener binds every interface); choose a "
                "free port, or unset listen_port to choose one per pool"
            )
            message = (
                f"pool {name!r}: backend.options.listen_port = {port} (from "
                f"{self.loaded.origins.get('backend.options.listen_port', 'default')}) {problem}"
            )
            raise PoolError(message)
        return port, self._origin("listen_port")

    def _g3(self, name: str, layout: PageLayout) -> G3Options | None:
        options = self.options
        if not options.g3_paths:
            return None
        size, page = layout.element_bytes, os.sysconf("SC_PAGE_SIZE")
        capacity = int(options.g3_capacity_bytes_per_file or 0)
        problem = None
        if layout.elements_per_page != 1:
            problem = (
                f"its pages are {layout.geometry.fragments_per_page} fragments, and KVCR 0.1.1's "
                "G3 tier takes single-element blocks only (MLA page_first / page_first_direct, "
                "or backend.options.staging, which stores each page as one element)"
            )
        elif size % page:
            problem = f"its pages of {size} bytes are not whole {page}-byte memory pages"
        elif capacity % size:
            problem = (
                f"backend.options.g3_capacity_bytes_per_file = {capacity} is not whole pages of "
                f"{size} bytes"
            )
        if problem is not None:
            where = self._origin("g3_paths")
            message = f"pool {name!r} cannot use the G3 tier ({where}): {problem}"
            raise PoolError(message)
        paths = tuple(Path(p).with_name(f"{Path(p).name}.{layout.pool}") for p in options.g3_paths)
        return G3Options(paths=paths, capacity_bytes_per_file=capacity, backend=options.g3_backend)

    def attach(self, spec: PoolSpec) -> KvcrPool:
        check_device(spec, self.devices, "backend 'kvcr' (NIXL over UCX, host memory)")
        geometry = spec.geometry
        capacity = int(self.config.placement.capacity_bytes)
        slots = capacity // geometry.page_bytes
        if slots < 1:
            message = (
                f"pool {spec.name!r}: placement.capacity_bytes ({capacity}, from "
                f"{self.loaded.origin('placement.capacity_bytes')}) holds no page of "
                f"{geometry.page_bytes} bytes; raise it"
            )
            raise PoolError(message)
        agent_name = f"kvcr-policy-{os.getpid()}-{kvcr_pool_name(spec.name)}-{uuid.uuid4().hex[:8]}"
        o = self.options
        staging = stages_pages(self.staging, geometry, int(o.staging_below_bytes))
        layout = PageLayout(kvcr_pool_name(spec.name), agent_name, geometry, staged=staging)
        g3 = self._g3(spec.name, layout)
        area = None
        if staging:
            area = Staging(spec, int(o.staging_bytes), layout.pool, agent_name)
        with self._lock:
            if self._closed:
                raise ClosedError("backend 'kvcr' is closed; build a new pipeline")
            region = self.placement.open_region(f"kvcr:{spec.name}", slots * geometry.page_bytes)
            try:
                address = spec.endpoint.address
                framework = area.region() if area else layout.framework_region(address)
                started = self._start(spec, layout, framework, region, g3)
            except Retained as err:
                # KVCR kept native resources that may still touch the region: never unmap it.
                with contextlib.suppress(RuntimeError):
                    region.close(wait=err.refuse)
                if area is not None:
                    kept.append(area)
                message = (
                    f"pool {spec.name!r}: the KVCR runner failed to start and could not stop its "
                    f"native work ({err.__cause__}); its region stays mapped until the process "
                    "exits"
                )
                raise PoolError(message) from err.__cause__
            except BaseException:
                region.close()
                raise
            self._ports[spec.name] = started.port
            pool = KvcrPool(
                spec.endpoint,
                layout,
                region,
                started.runner,
                started.policy,
                self.config.batching.query_batch_keys,
                self.options.progress_thread,
                area,
                min(self.config.batching.window_batches or STAGING_THREADS, MAX_STAGING_THREADS),
            )
            self._pools[spec.name] = pool
        log.info(
            "pool %r on KVCR runner %s: %d pages in %s (%d bytes), listen port %d (%s)",
            spec.name, agent_name, slots, region.name, region.size, *started.port,
        )  # fmt: skip
        return pool

    def _start(
        self,
        spec: PoolSpec,
        layout: PageLayout,
        framework: RegionDescriptor,
        region: Region,
        g3: G3Options | None,
    ) -> Started:
        """A runner for ``spec``; a port chosen free that was taken meanwhile is chosen again."""
        for attempt in range(2):
            port = self._port(spec.name)
            try:
                return start_runner(
                    layout,
                    framework,
                    region,
                    g3,
                    port,
                    eviction=self.eviction,
                    op_timeout_s=self.config.transport.op_timeout_s,
                    progress_thread=self.options.progress_thread,
                    poll_interval_s=self.options.poll_interval_s,
                )
            except StartFailed as failed:
                err = failed.__cause__
                chosen = self.options.listen_port is None
                if chosen and attempt == 0 and "bind" in str(err).lower():
                    continue
                message = (
                    f"pool {spec.name!r}: the KVCR runner could not start: {err} (listen port "
                    f"{port[0]}, {port[1]}; UCX_TLS={os.environ.get('UCX_TLS')!r}, "
                    f"UCX_NET_DEVICES={os.environ.get('UCX_NET_DEVICES')!r})"
                )
                raise PoolError(message) from err
        raise AssertionError("unreachable")  # the loop returns or raises

    # ---- reports and lifetime -------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        versions: dict[str, str | None] = {}
        for dist in ("kvcr", "nixl"):
            try:
                versions[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                versions[dist] = None
        return {
            "name": self.name,
            "capabilities": [],
            "moves_with": "NIXL over UCX (inside KVCR)",
            "versions": versions,
            "process": {
                **self.process.to_dict(),
                "nixl_progress_thread": {
                    "value": self.options.progress_thread,
                    "source": self._origin("progress_thread"),
                },
                "listen_ports": {
                    pool: {"value": port, "source": source}
                    for pool, (port, source) in self._ports.items()
                },
            },
            "staging": {
                "value": self.staging,
                "source": self.staging_source,
                "pools": {
                    name: pool.staging.describe()
                    for name, pool in self._pools.items()
                    if pool.staging is not None
                },
            },
            "operation_timeout_s": {
                "value": self.config.transport.op_timeout_s,
                "source": f"transport.op_timeout_s (from "
                f"{self.loaded.origin('transport.op_timeout_s')})",
            },
        }

    def close(self) -> None:
        """Close every pool (each waits for its runner first); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pools = list(self._pools.values())
        errors: list[BaseException] = []
        for pool in pools:
            try:
                pool.close()
            except BaseException as err:
                errors.append(err)
        if errors:
            raise errors[0]
