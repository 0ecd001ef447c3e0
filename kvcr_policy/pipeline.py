"""build_pipeline and Pipeline: pools, one tier backend, the mover, lifetime.

A Pipeline stores and restores KV pages between registered pools and the tier backend the
configuration names (``backend.name``: the process-owned DRAM tier, a peer over UCX, or a
plugin's). It validates pools, keys and indices, hands each call to the
:class:`~kvcr_policy.mover.Mover`, and owns the lifetime; it never branches on the backend.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np

from .backends.base import BackendContext, Endpoint, PoolSpec, PoolTier, TierBackend
from .errors import ClosedError, IndicesError, PoolError, UnsupportedError
from .geometry import PoolGeometry, page_indices, validate_buffer
from .loading import LoadedConfig, load_config
from .mover import Mover
from .plugins import PluginManager, make_plugin_manager
from .schema import STRATEGY_SECTIONS
from .stats import PipelineStats, StatsRecorder
from .strategies import (
    BatchingStrategy,
    CoalescingStrategy,
    FallbackStrategy,
    PlacementStrategy,
    ThreadTuningStrategy,
)

__all__ = ["Pipeline", "build_pipeline"]

log = logging.getLogger("kvcr_policy.pipeline")


class Pipeline:
    """Moves KV pages between registered pools and one tier backend; see DESIGN.md.

    The pipeline holds the pools, the backend and the lifetime; the :class:`Mover` drives
    every transfer. It never branches on the kind of backend.

    Lifetime: open -> closing -> closed. :meth:`close` waits for in-flight calls, closes the
    backend (which never unmaps memory a transfer may still touch) and restores thread tuning;
    calls after it raise :class:`ClosedError`.
    """

    def __init__(
        self,
        loaded: LoadedConfig,
        pm: PluginManager,
        *,
        batching: BatchingStrategy,
        coalescing: CoalescingStrategy,
        placement: PlacementStrategy,
        thread_tuning: ThreadTuningStrategy,
        fallback: FallbackStrategy,
        transport: Any,
        backend: TierBackend,
    ) -> None:
        self.loaded = loaded
        self.config = loaded.config
        self._pm = pm
        self.batching = batching
        self.coalescing = coalescing
        self.placement = placement
        self.thread_tuning = thread_tuning
        self.fallback = fallback
        self.transport = transport
        self.backend = backend
        missing = coalescing.needs - backend.capabilities
        if missing:
            what = ", ".join(sorted(missing))
            message = (
                f"backend {backend.name!r} (transport {getattr(transport, 'name', '?')!r}) "
                f"cannot {what} descriptors, which {_asking(loaded, missing)}"
            )
            if self.config.coalescing.on_unsupported == "error":
                raise UnsupportedError(message + "; set coalescing.on_unsupported = 'fallback'")
            log.warning("%s; sending plain descriptors (coalescing.on_unsupported)", message)
        self.allowed = coalescing.needs & backend.capabilities
        self._pools: dict[str, tuple[PoolGeometry, PoolTier]] = {}
        self.refused: dict[str, str] = {}
        self._stats = StatsRecorder()
        self._mover = Mover(batching, coalescing, self.allowed, fallback, self._stats)
        self._cond = threading.Condition()
        self._active = 0
        self.state = "open"
        thread_tuning.apply()

    # ---- lifetime -----------------------------------------------------------------------

    @contextmanager
    def _operation(self, call: str) -> Iterator[None]:
        with self._cond:
            if self.state != "open":
                raise ClosedError(f"pipeline is {self.state}: {call}() refused; build a new one")
            self._active += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._stats.timed(call, time.perf_counter() - start)
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """Wait for in-flight calls, then release everything; idempotent."""
        with self._cond:
            if self.state == "closed":
                return
            if self.state == "closing":
                self._cond.wait_for(lambda: self.state == "closed")
                return
            self.state = "closing"
            self._cond.wait_for(lambda: self._active == 0)
        try:
            try:
                self.backend.close()
            finally:
                self.thread_tuning.restore()
        finally:
            final = self.stats().to_dict()
            with self._cond:
                self.state = "closed"
                self._cond.notify_all()
            self._pm.call_safely("kvcr_pipeline_closed", pipeline=self, stats=final)

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- pools --------------------------------------------------------------------------

    def register_pool(self, name: str, geometry: PoolGeometry, buffer: Any) -> None:
        """Validate ``buffer`` against ``geometry`` and attach the pool to the backend.

        A pool that fails validation is refused with a :class:`PoolError` naming the field;
        pools registered before or after it keep working.
        """
        with self._operation("register_pool"):
            if name in self._pools:
                message = f"pool {name!r} is already registered; pick another name"
                raise PoolError(message)
            try:
                if geometry.name != name:
                    geometry = replace(geometry, name=name)
                info = validate_buffer(geometry, buffer)
                endpoint = Endpoint(info.address, info.nbytes, info.device, buffer)
                tier = self.backend.attach(PoolSpec(name, geometry, endpoint))
            except PoolError as err:
                self.refused[name] = str(err)
                raise
            self._pools[name] = (geometry, tier)
            self.refused.pop(name, None)
            log.info("pool %r registered on backend %r: %s", name, self.backend.name, geometry)

    @property
    def pools(self) -> dict[str, PoolGeometry]:
        return {name: geometry for name, (geometry, _) in self._pools.items()}

    def _pool(self, name: str | None) -> tuple[PoolGeometry, PoolTier]:
        if name is None:
            name = next(iter(self._pools)) if len(self._pools) == 1 else "kv"
        pool = self._pools.get(name)
        if pool is None:
            if name in self.refused:
                raise PoolError(f"pool {name!r} was refused: {self.refused[name]}")
            known = ", ".join(self._pools) or "none"
            raise PoolError(f"no pool named {name!r} is registered (registered: {known})")
        return pool

    def _pages(self, geometry: PoolGeometry, keys: Sequence[str], indices: Any) -> np.ndarray:
        pages = page_indices(geometry, indices)
        if len(pages) != len(keys):
            message = (
                f"pool {geometry.name!r}: {len(keys)} keys but indices for {len(pages)} "
                f"pages; pass {geometry.page_size} token indices per key"
            )
            raise IndicesError(message)
        return pages

    # ---- metadata -----------------------------------------------------------------------

    def exists(self, keys: Sequence[str], pool: str | None = None) -> int:
        """How many keys from the start are present, asked in metadata-query batches."""
        with self._operation("exists"):
            self._stats.add(keys_queried=len(keys))
            return self._mover.count(self._pool(pool)[1], keys)

    def exists_pools(self, keys: Sequence[str], pools: Sequence[str]) -> int:
        """The usable prefix over several pools: the minimum of their counts."""
        return min((self.exists(keys, name) for name in pools), default=0)

    # ---- data ---------------------------------------------------------------------------

    def get(
        self,
        keys: Sequence[str],
        indices: Any,
        pool: str | None = None,
        *,
        on_ready: Callable[[int], None] | None = None,
    ) -> list[bool]:
        """Restore ``keys`` into the pool pages at ``indices``; True per page that arrived.

        Only the leading run of present keys is read. ``on_ready(n)`` is told, in order, how
        many leading pages are complete, so a caller can use them before the call returns.
        """
        with self._operation("get"):
            return self._move(True, list(keys), indices, pool, on_ready)

    def set(self, keys: Sequence[str], indices: Any, pool: str | None = None) -> list[bool]:
        """Store the pool pages at ``indices`` under ``keys``; True per key now present."""
        with self._operation("set"):
            return self._move(False, list(keys), indices, pool, None)

    def _move(
        self,
        read: bool,
        keys: list[str],
        indices: Any,
        pool: str | None,
        on_ready: Callable[[int], None] | None,
    ) -> list[bool]:
        geometry, tier = self._pool(pool)
        pages = self._pages(geometry, keys, indices)
        transfer = tier.begin(read, keys, pages)
        try:
            moved = self._mover.move(transfer, read, geometry.page_bytes, on_ready)
        except BaseException:
            transfer.abort()
            raise
        return transfer.finish(moved)

    def get_pools(self, requests: Mapping[str, tuple[Sequence[str], Any]]) -> dict[str, list[bool]]:
        """:meth:`get` for several pools: ``{pool: (keys, indices)}`` -> ``{pool: results}``."""
        return {name: self.get(keys, idx, name) for name, (keys, idx) in requests.items()}

    def set_pools(self, requests: Mapping[str, tuple[Sequence[str], Any]]) -> dict[str, list[bool]]:
        """:meth:`set` for several pools: ``{pool: (keys, indices)}`` -> ``{pool: results}``."""
        return {name: self.set(keys, idx, name) for name, (keys, idx) in requests.items()}

    def delete(self, keys: Sequence[str], pool: str | None = None) -> int:
        with self._operation("delete"):
            return self._pool(pool)[1].delete(keys)

    def clear(self) -> None:
        """Forget every key of every pool (claimed slots are freed once released)."""
        with self._operation("clear"):
            for _, tier in self._pools.values():
                tier.clear()

    def probe(self, nbytes: int, pool: str | None = None) -> None:
        """Move ``nbytes`` from the tier into the pool's first bytes with the backend's largest
        single operation, and return once they arrived.

        This is what a benchmark times as the limit of a restore (one contiguous copy through
        the same transport; one UCX message from the peer's tier). It overwrites the pool's
        first ``nbytes`` and stores nothing; keys and claims are untouched.
        """
        with self._operation("probe"):
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
                raise IndicesError(f"probe: expected a positive number of bytes, got {nbytes!r}")
            self._pool(pool)[1].probe(nbytes)

    # ---- reporting ----------------------------------------------------------------------

    def stats(self) -> PipelineStats:
        pools = {name: tier.stats() for name, (_, tier) in self._pools.items()}
        return self._stats.snapshot(pools, self.backend.describe())

    def audit(self) -> dict[str, Any]:
        """The placement audit of every pool whose backend places memory."""
        audits = {name: tier.audit() for name, (_, tier) in self._pools.items()}
        return {name: audit for name, audit in audits.items() if audit is not None}


def _asking(loaded: LoadedConfig, missing: frozenset[str]) -> str:
    """The options that ask for the ``missing`` capabilities, with their values and origins."""
    section = loaded.config.coalescing
    options = []
    if "split" in missing and section.split_bytes is not None:
        split = loaded.origin("coalescing.split_bytes")
        options.append(f"coalescing.split_bytes {int(section.split_bytes)} (from {split})")
    if missing - {"split"} or not options:
        strategy = loaded.origin("coalescing.strategy")
        options.insert(0, f"coalescing.strategy {section.strategy!r} (from {strategy})")
    return " and ".join(options) + (" ask for" if len(options) > 1 else " asks for")


def build_pipeline(loaded: LoadedConfig | None = None, *, transport: Any = None) -> Pipeline:
    """Resolve every configured strategy, the transport and the backend once; open a Pipeline.

    ``transport`` replaces the configured one (tests inject a faulty memory transport).
    """
    loaded = loaded or load_config()
    config = loaded.config
    pm = loaded.plugin_manager or make_plugin_manager(config)
    registry = pm.registry

    def make(kind: str, section: Any) -> Any:
        return registry.get(kind, section.strategy).create(section, options=section.options)

    if transport is None:
        spec = registry.get("transport", config.transport.name)
        transport = spec.create(config, options=config.transport.options)
    strategies = {kind: make(kind, getattr(config, kind)) for kind in STRATEGY_SECTIONS}
    context = BackendContext(loaded, strategies["placement"], transport, strategies["coalescing"])
    name = registry.backend_for(config.backend.name, config.transport.name)
    backend = registry.get("backend", name).create(context, options=config.backend.options)
    try:
        pipeline = Pipeline(loaded, pm, transport=transport, backend=backend, **strategies)
    except BaseException:
        backend.close()
        raise
    pm.call_safely("kvcr_pipeline_opened", pipeline=pipeline)
    return pipeline
