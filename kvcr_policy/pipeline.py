"""build_pipeline and Pipeline: pools, one tier backend, the mover, lifetime.

A Pipeline stores and restores KV pages between registered pools and the tier backend the
configuration names (``backend.name``: the process-owned DRAM tier, a peer over UCX, or a
plugin's). It validates pools, keys (:mod:`kvcr_policy.keys`: one rule for every backend) and
indices, checks on each call that a pool's memory is still where it was registered, hands each
call to the :class:`~kvcr_policy.mover.Mover`, and owns the lifetime; it never branches on the
backend.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np

from .admission import AdmissionDesk
from .backends import reporting as reports
from .backends.base import (
    BackendContext,
    EarlyRead,
    Endpoint,
    PoolReadsEarly,
    PoolSpec,
    PoolTier,
    TierBackend,
)
from .config.loading import LoadedConfig, load_config
from .config.schema import STRATEGY_SECTIONS, strategy_name
from .errors import (
    ClosedError,
    IndicesError,
    PoolError,
    UnsupportedError,
    UsageError,
)
from .geometry import BufferInfo, PoolGeometry, check_unchanged, key_pages, validate_buffer
from .keys import check_keys, rounds
from .mover import Mover
from .observability.ledger import CallCounts, Ledger
from .observability.meter import PoolMeter
from .observability.meters import Meters
from .observability.stats import PipelineStats
from .plugins import PluginManager, make_plugin_manager
from .strategies import (
    Admission,
    AdmissionStrategy,
    BatchingStrategy,
    CoalescingStrategy,
    EvictionStrategy,
    FallbackStrategy,
    PlacementStrategy,
    ThreadTuningStrategy,
)
from .values import shorten

__all__ = ["Pipeline", "build_pipeline"]

log = logging.getLogger("kvcr_policy.pipeline")


class Pipeline:
    """Moves KV pages between registered pools and one tier backend; see DESIGN.md.

    The pipeline holds the pools, the backend and the lifetime; the :class:`Mover` drives
    every transfer. It never branches on the kind of backend.

    Lifetime: open -> closing -> closed. :meth:`close` waits for in-flight calls, closes the
    backend (which never unmaps memory a transfer may still touch) and restores thread tuning;
    calls after it raise :class:`ClosedError` (``stats()`` and ``audit()`` too; the last
    counters stay in :attr:`final_stats`).

    Metrics (``observability.metrics``): each pool gets a
    :class:`~kvcr_policy.observability.meter.PoolMeter` that exists, get and set feed once per
    call, never per page: the same :class:`~kvcr_policy.observability.ledger.CallCounts` each
    call adds to the totals :meth:`stats` reports.
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
        eviction: EvictionStrategy | None = None,
        admission: AdmissionStrategy | None = None,
    ) -> None:
        self.loaded = loaded
        self.config = loaded.config
        self._pm = pm
        self.batching = batching
        self.coalescing = coalescing
        self.placement = placement
        self.thread_tuning = thread_tuning
        self.fallback = fallback
        #: The eviction strategy the backend's stores take their policies from.
        self.eviction = eviction
        self.transport = transport
        self.backend = backend
        #: The admission strategy lookups ask (:meth:`admit`), with the live restore figures.
        self.admission = AdmissionDesk(admission or _ReportAll())
        missing = coalescing.needs - backend.capabilities
        if missing:
            # The transport is named only where the backend moves through it (dram); kvcr,
            # mooncake and peer move pages themselves, and "transport 'cpu'" misled there.
            moves = getattr(backend, "transport", None) is transport and transport is not None
            via = f" (transport {getattr(transport, 'name', '?')!r})" if moves else ""
            message = (
                f"backend {backend.name!r}{via} cannot {' or '.join(sorted(missing))} "
                f"descriptors, as {_asking(loaded, missing)}"
            )
            if self.config.coalescing.on_unsupported == "error":
                raise UnsupportedError(message + "; set coalescing.on_unsupported = 'fallback'")
            log.warning("%s; sending plain descriptors (coalescing.on_unsupported)", message)
        self.allowed = coalescing.needs & backend.capabilities
        self._pools: dict[str, tuple[PoolGeometry, PoolTier]] = {}
        self._memory: dict[str, tuple[Any, BufferInfo]] = {}  # the buffer, as validated
        #: Pools whose tier starts a read's first copies early (:class:`PoolReadsEarly`).
        self._reads_early: set[str] = set()
        self.refused: dict[str, str] = {}
        # The ``profile`` label of the metrics is the profile file's name.
        profile = Path(loaded.profile).stem if loaded.profile else "default"
        self.meters = Meters(self.config.observability.metrics, backend.name, profile)
        self._ledger = Ledger()
        least = self.config.batching.read_batch_bytes
        self._mover = Mover(batching, coalescing, self.allowed, fallback,
                            None if least is None else int(least))  # fmt: skip
        self._cond = threading.Condition()
        self._active = 0
        #: The counters as close() left them (stats() raises ClosedError after close).
        self.final_stats: PipelineStats | None = None
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
            self._ledger.timed(call, time.perf_counter() - start)
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
                self.meters.close()
        finally:
            self.final_stats = self._snapshot()
            final = self.final_stats.to_dict()
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
            if not isinstance(name, str) or not name:
                message = f"register_pool(): name must be a non-empty str, got {shorten(name)}"
                raise UsageError(message)
            if not isinstance(geometry, PoolGeometry):
                message = (
                    "register_pool(): geometry must be a kvcr_policy.geometry.PoolGeometry "
                    f"(e.g. preset('small', tokens=...)), got {type(geometry).__name__}"
                )
                raise UsageError(message)
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
            self._memory[name] = (buffer, info)
            if isinstance(tier, PoolReadsEarly):
                self._reads_early.add(name)
            self.refused.pop(name, None)
            log.info("pool %r registered on backend %r: %s", name, self.backend.name, geometry)
            meter = self.meters.open(name)
            if meter is not None:
                self._attached(meter, tier)

    def _attached(self, meter: PoolMeter, tier: PoolTier) -> None:
        """A pool just registered: its tier usage, and its audit and link limit if asked."""
        wanted = self.config.observability
        meter.usage(tier)
        if wanted.audit_placement:
            found = reports.audit_of(tier)
            if found is not None:
                meter.placement(found)
        if wanted.link_probe_bytes is not None:
            nbytes = int(wanted.link_probe_bytes)
            # Twice: the first run also faults the pages in.
            meter.probe(lambda: reports.probe(tier, nbytes), nbytes, runs=2)
        elif wanted.link_limit_gbps is not None:
            meter.link_limit(wanted.link_limit_gbps * 1e9)

    def count_misses(self, pool: str, read: bool, reason: str, pages: int) -> None:
        """Count misses a caller decided before reaching the pipeline (an integration that
        refused the pool itself); ``reason`` as in
        :data:`~kvcr_policy.observability.metrics.MISS_REASONS`. ``pool`` becomes a label:
        pass names from a fixed set (the engine's pool names), never user input."""
        meter = self.meters.open(pool)
        if meter is not None:
            meter.direction(read).miss(reason, pages)

    @property
    def pools(self) -> dict[str, PoolGeometry]:
        return {name: geometry for name, (geometry, _) in self._pools.items()}

    def _pool(self, name: str | None, *, touch: bool = False) -> tuple[PoolGeometry, PoolTier]:
        """The pool ``name`` (the only one, or ``kv``, when None); ``touch``: the call moves
        bytes, so its memory must still be where it was registered."""
        if name is None:
            name = next(iter(self._pools)) if len(self._pools) == 1 else "kv"
        elif not isinstance(name, str):
            raise UsageError(f"pool must be a str naming a registered pool, got {shorten(name)}")
        pool = self._pools.get(name)
        if pool is None:
            if name in self.refused:
                raise PoolError(f"pool {name!r} was refused: {self.refused[name]}")
            known = ", ".join(self._pools) or "none"
            raise PoolError(f"no pool named {shorten(name)} is registered (registered: {known})")
        if touch:
            buffer, info = self._memory[name]
            check_unchanged(pool[0], buffer, info)
        return pool

    # ---- metadata -----------------------------------------------------------------------

    def exists(self, keys: Sequence[str], pool: str | None = None) -> int:
        """How many keys from the start are present, asked in metadata-query batches."""
        with self._operation("exists"):
            keys = check_keys(keys, "exists")
            self._ledger.queried(len(keys))
            geometry, tier = self._pool(pool)
            start = time.perf_counter()
            found = self._mover.count(tier, keys)
            meter = self.meters.get(geometry.name)
            if meter is not None:
                meter.exists(len(keys), found, time.perf_counter() - start)
            return found

    def exists_pools(self, keys: Sequence[str], pools: Sequence[str]) -> int:
        """The usable prefix over several pools: the minimum of their counts."""
        return min((self.exists(keys, name) for name in pools), default=0)

    def admit(
        self, found: int, pools: Sequence[str] | None = None, keys: Sequence[str] = ()
    ) -> int:
        """How many of ``found`` leading present pages a lookup reports as hits: the
        admission strategy's decision (``admission.strategy``; ``none``: all of them) on this
        pipeline's live restore rate and queue, for pages of ``pools`` (every registered pool
        when None: a restore reads a page of each), counted and explained (debug log). Given
        the lookup's ``keys``, the declined ones are noted for each pool in
        ``admission.declined``, for the engine's next write to leave out (:mod:`.declined`)."""
        with self._operation("admit"):
            names, geometries = self._admitted_pools(pools)
            if not geometries or found <= 0:
                return max(int(found), 0) if geometries else 0
            first = geometries[0]
            page_bytes = sum(g.page_bytes for g in geometries)
            meter = self.meters.get(first.name)
            return self.admission.decide(
                first.name, found, first.page_size, page_bytes, meter, keys, names
            )

    def declines(self, pages: int, pools: Sequence[str] | None = None) -> Admission | None:
        """The admission strategy's decision on a lookup of ``pages`` pages of ``pools`` were
        they all present, when it reports none of them: counted, every page declined, as
        :meth:`admit` counts a lookup (the lookup answers "no hit" without asking the tier: no
        shorter present run would be one either). None, uncounted, when it would report some
        (the lookup asks the tier, then :meth:`admit`), or no pool is registered."""
        with self._operation("declines"):
            names, geometries = self._admitted_pools(pools)
            if not geometries:
                return None
            first = geometries[0]
            page_bytes = sum(g.page_bytes for g in geometries)
            meter = self.meters.get(first.name)
            return self.admission.declines(
                first.name, pages, first.page_size, page_bytes, meter, names
            )

    def _admitted_pools(self, pools: Sequence[str] | None) -> tuple[list[str], list[PoolGeometry]]:
        """The pools a lookup's pages are restored into (every registered one when None: a
        restore reads a page of each), and their geometries."""
        names = list(self._pools) if pools is None else list(pools)
        return names, [self._pool(name)[0] for name in names]

    def restored(self, pages: int, seconds: float, pools: Sequence[str] | None = None) -> None:
        """The engine waited ``seconds`` for ``pages`` pages of ``pools`` (every registered pool
        when None) from the lookup that asked the tier for them to their restore's end: the
        restore rate the admission strategy decides on, where the engine times its restores
        (``admission.engine_times_restores``: what a restore costs a request, the engine's
        own steps of waiting included, not only the tier's call)."""
        _, geometries = self._admitted_pools(pools)
        if geometries and pages > 0:
            nbytes = pages * sum(g.page_bytes for g in geometries)
            self.admission.restores.add(nbytes, seconds)

    def prefill_observed(
        self, tokens: int, seconds: float, steps: int = 1, squares: int | None = None
    ) -> None:
        """The engine computed ``tokens`` prompt tokens in ``seconds`` over ``steps`` steps (an
        engine that exposes its prefill time reports it here; the admission strategy then
        prefers its marginal rate: each step's fixed cost is fitted apart, and its attention's
        cost where ``squares`` gives the prompts' squared spans or the steps tell it:
        :class:`~kvcr_policy.observability.prefill_cost.PrefillCost`)."""
        self.admission.prefills.add(tokens, seconds, steps, squares)

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
            return self._move(True, keys, indices, pool, on_ready)

    def set(self, keys: Sequence[str], indices: Any, pool: str | None = None) -> list[bool]:
        """Store the pool pages at ``indices`` under ``keys``; True per key now present."""
        with self._operation("set"):
            return self._move(False, check_keys(keys, "set"), indices, pool, None)

    def _move(
        self,
        read: bool,
        keys: Any,
        indices: Any,
        pool: str | None,
        on_ready: Callable[[int], None] | None,
    ) -> list[bool]:
        """One get (``keys`` as the caller gave them: checked here) or set (``keys`` checked)."""
        name = pool
        early: EarlyRead | None = None
        try:
            try:
                try:
                    geometry, tier = self._pool(pool, touch=True)
                except PoolError:
                    if read:  # a key the caller got wrong is named first, as ever
                        check_keys(keys, "get")
                    raise
                name = geometry.name
                if read and name in self._reads_early and type(keys) is list:
                    # The read's first copies, started while the call is checked: for pages
                    # stored together they begin before the keys and indices are validated
                    # and the keys claimed, and are kept only where the claim finds the same
                    # bytes (a key that is no str is found in no tier: nothing is read early).
                    try:
                        early = cast(PoolReadsEarly, tier).read_early(keys)
                    except TypeError:  # a key no tier can look up: refused just below
                        early = None
                if read:
                    keys = check_keys(keys, "get")
                pages = key_pages(geometry, keys, indices)
            except PoolError:
                if name is not None and (name in self._pools or name in self.refused):
                    self.count_misses(name, read, "pool_refused", len(keys))
                raise
            repeats = rounds(keys)
            if repeats is None:
                return self._call(geometry, tier, read, keys, pages, on_ready, early)
            call = partial(self._call, geometry, tier, read)
            return _rounds(call, read, keys, pages, repeats, on_ready)
        finally:
            if early is not None:
                early.cancel()  # a no-op once the call's transfer used it and finished

    def _call(
        self,
        geometry: PoolGeometry,
        tier: PoolTier,
        read: bool,
        keys: list[str],
        pages: np.ndarray,
        on_ready: Callable[[int], None] | None = None,
        early: EarlyRead | None = None,
    ) -> list[bool]:
        """One get or set call through the mover, recorded once in the ledger and the meter."""
        meter = self.meters.get(geometry.name)
        page_bytes = geometry.page_bytes
        counts = CallCounts(read)
        start = time.perf_counter()
        try:
            if read:
                claims = None if meter is None else meter.claims.inc
                source = tier if early is None else early
                with self.admission.restoring(len(keys) * page_bytes):
                    return self._mover.read(
                        source, keys, pages, page_bytes, counts, on_ready, claims
                    )
            with self.admission.storing(len(keys) * page_bytes):
                return self._mover.write(tier, keys, pages, page_bytes, counts)
        finally:
            if counts.pages and not (read and self.admission.engine_times_restores):
                rate = self.admission.restores if read else self.admission.stores
                rate.add(counts.pages * page_bytes, time.perf_counter() - start)
            self._ledger.record(counts, page_bytes)
            if meter is not None:
                meter.record(counts, page_bytes, time.perf_counter() - start)
                # A write may have evicted and filled slots; a read too where the tier moves
                # pages between its levels on a hit (usage_on_read: the cascade).
                if counts.error is None and (not read or getattr(tier, "usage_on_read", False)):
                    meter.usage(tier)

    def get_pools(self, requests: Mapping[str, tuple[Sequence[str], Any]]) -> dict[str, list[bool]]:
        """:meth:`get` for several pools: ``{pool: (keys, indices)}`` -> ``{pool: results}``."""
        return {name: self.get(keys, idx, name) for name, (keys, idx) in requests.items()}

    def set_pools(self, requests: Mapping[str, tuple[Sequence[str], Any]]) -> dict[str, list[bool]]:
        """:meth:`set` for several pools: ``{pool: (keys, indices)}`` -> ``{pool: results}``."""
        return {name: self.set(keys, idx, name) for name, (keys, idx) in requests.items()}

    def delete(self, keys: Sequence[str], pool: str | None = None) -> int:
        with self._operation("delete"):
            geometry, tier = self._pool(pool)
            removed = tier.delete(check_keys(keys, "delete"))
            meter = self.meters.get(geometry.name)
            if meter is not None:
                meter.usage(tier)
            return removed

    def clear(self) -> None:
        """Forget every key of every pool (claimed slots are freed once released)."""
        with self._operation("clear"):
            for name, (_, tier) in self._pools.items():
                tier.clear()
                meter = self.meters.get(name)
                if meter is not None:
                    meter.usage(tier)

    def probe(self, nbytes: int, pool: str | None = None) -> None:
        """Move ``nbytes`` from the tier into the pool's first bytes with the backend's largest
        single operation, and return once they arrived.

        This is what a benchmark times as the limit of a restore (one contiguous copy through
        the same transport; one UCX message from the peer's tier). It overwrites the pool's
        first ``nbytes`` and stores nothing; keys and claims are untouched.
        """
        with self._operation("probe"):
            geometry, tier = self._probed(nbytes, pool, "probe")
            meter = self.meters.get(geometry.name)
            if meter is not None:
                meter.probe(lambda: reports.probe(tier, nbytes), nbytes)  # the link-limit gauge
            else:
                reports.probe(tier, nbytes)

    def probe_store(self, nbytes: int, pool: str | None = None) -> None:
        """:meth:`probe` the other way, a store's limit: the pool's first ``nbytes`` into the
        tier with the backend's largest single operation. It overwrites the tier's first bytes,
        so a backend takes it only while its tier is empty and idle (the ``dram`` tier refuses
        otherwise: :meth:`clear` first); an UnsupportedError where the backend has none."""
        with self._operation("probe_store"):
            _, tier = self._probed(nbytes, pool, "probe_store")
            reports.probe_store(tier, nbytes)

    def _probed(self, nbytes: int, pool: str | None, name: str) -> tuple[PoolGeometry, PoolTier]:
        """The pool a probe of ``nbytes`` moves, and its tier; refused where it does not fit."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
            raise IndicesError(f"{name}: expected a positive number of bytes, got {nbytes!r}")
        geometry, tier = self._pool(pool, touch=True)
        if nbytes > geometry.nbytes:  # every backend: the pool's own bounds (its tier's too)
            message = (
                f"pool {geometry.name!r}: {name} of {nbytes} bytes does not fit the pool "
                f"({geometry.nbytes} bytes); probe at most {geometry.nbytes}"
            )
            raise IndicesError(message)
        return geometry, tier

    # ---- reporting ----------------------------------------------------------------------

    def stats(self) -> PipelineStats:
        """Counters, and each pool's and the backend's figures (ClosedError after close)."""
        with self._operation("stats"):
            return self._snapshot()

    def _snapshot(self) -> PipelineStats:
        pools = {name: reports.stats_of(tier) for name, (_, tier) in self._pools.items()}
        return self._ledger.snapshot(pools, reports.describe(self.backend))

    def audit(self) -> dict[str, Any]:
        """The placement audit of every pool whose backend places memory."""
        with self._operation("audit"):
            audits = {name: reports.audit_of(tier) for name, (_, tier) in self._pools.items()}
            found = {name: audit for name, audit in audits.items() if audit is not None}
            for name, audit in found.items():
                meter = self.meters.get(name)
                if meter is not None:
                    meter.placement(audit)  # the placement gauges follow every audit
            return found


class _ReportAll:
    """Admission when none was resolved (a pipeline built by hand): every present page."""

    def admit(self, found: int, page_tokens: int, page_bytes: int, outlook: Any) -> Admission:
        return Admission(found, "no_gate")


def _rounds(
    call: Callable[[list[str], np.ndarray], list[bool]],
    read: bool,
    keys: list[str],
    pages: np.ndarray,
    repeats: list[np.ndarray],
    on_ready: Callable[[int], None] | None,
) -> list[bool]:
    """A call whose keys repeat, made as ``call(keys, pages)`` per round (kvcr_policy.keys), so
    that a backend sees each key once per call: a set stores the first occurrence's page and
    every occurrence reports it; a get reads round after round."""
    results = np.zeros(len(keys), dtype=bool)
    for positions in repeats if read else repeats[:1]:
        results[positions] = call([keys[i] for i in positions], pages[positions])
    if not read:
        outcome = dict(zip((keys[i] for i in repeats[0]), results[repeats[0]], strict=True))
        return [bool(outcome[key]) for key in keys]
    leading = int(np.argmin(results)) if not results.all() else len(keys)
    results[leading:] = False  # reads report the leading run, as without repeats
    if on_ready is not None and leading:
        on_ready(leading)
    return results.tolist()


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
    return " and ".join(options) + (" ask" if len(options) > 1 else " asks")


def build_pipeline(loaded: LoadedConfig | None = None, *, transport: Any = None) -> Pipeline:
    """Resolve every configured strategy, the transport and the backend once; open a Pipeline.

    ``transport`` replaces the configured one (tests inject a faulty memory transport).
    """
    if loaded is None:
        loaded = load_config()
    elif not isinstance(loaded, LoadedConfig):
        message = (
            "build_pipeline(): expected a LoadedConfig from load_config(...), got "
            f"{type(loaded).__name__} {shorten(loaded)}; e.g. "
            "build_pipeline(load_config('throughput'))"
        )
        raise UsageError(message)
    config = loaded.config
    pm = loaded.plugin_manager or make_plugin_manager(config)
    registry = pm.registry

    def make(kind: str, section: Any) -> Any:
        name = strategy_name(config, kind)
        return registry.get(kind, name).create(section, options=section.options)

    if transport is None:
        spec = registry.get("transport", config.transport.name)
        transport = spec.create(config, options=config.transport.options)
    strategies = {kind: make(kind, getattr(config, kind)) for kind in STRATEGY_SECTIONS}
    context = BackendContext(
        loaded, strategies["placement"], transport, strategies["coalescing"], strategies["eviction"]
    )
    name = registry.backend_for(config.backend.name, config.transport.name)
    backend = registry.get("backend", name).create(context, options=config.backend.options)
    try:
        pipeline = Pipeline(loaded, pm, transport=transport, backend=backend, **strategies)
    except BaseException:
        backend.close()
        raise
    pm.call_safely("kvcr_pipeline_opened", pipeline=pipeline)
    return pipeline
