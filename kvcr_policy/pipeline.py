"""build_pipeline and Pipeline: pools, the DRAM tier, batches, windows, fallback, lifetime.

A Pipeline stores and restores KV pages between registered pools and a process-owned DRAM
tier that mirrors each pool's layout (slots in place of pages), so a prefix stored together
and restored into consecutive pages is a handful of large copies once coalesced.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .backends.dram.store import Store
from .backends.dram.tier import Region
from .backends.dram.transports.base import Endpoint, RemotePool, Transport
from .errors import ClosedError, IndicesError, PoolError, UnsupportedError
from .geometry import PoolGeometry, page_indices, validate_buffer
from .loading import LoadedConfig, load_config
from .mover import Mover
from .plugins import PluginManager, make_plugin_manager
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


@dataclass(frozen=True, slots=True)
class _Pool:
    """One registered pool: its buffer, and the tier region and store that mirror it."""

    geometry: PoolGeometry
    endpoint: Endpoint
    tier_geometry: PoolGeometry
    region: Region
    tier: Endpoint
    store: Store


class Pipeline:
    """Moves KV pages between registered pools and the DRAM tier; see DESIGN.md, "The engine".

    Lifetime: open -> closing -> closed. :meth:`close` waits for in-flight calls, restores
    thread tuning, and never unmaps memory a transfer may still touch; calls after it raise
    :class:`ClosedError`.
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
        transport: Transport,
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
        missing = coalescing.needs - transport.capabilities
        if missing:
            what = ", ".join(sorted(missing))
            origin = loaded.origin("coalescing.strategy")
            message = (
                f"transport {transport.name!r} cannot {what} descriptors, which "
                f"coalescing.strategy {self.config.coalescing.strategy!r} (from {origin}) asks for"
            )
            if self.config.coalescing.on_unsupported == "error":
                raise UnsupportedError(message + "; set coalescing.on_unsupported = 'fallback'")
            log.warning("%s; sending plain descriptors (coalescing.on_unsupported)", message)
        self.allowed = coalescing.needs & transport.capabilities
        self._pools: dict[str, _Pool] = {}
        self._remote: dict[str, tuple[PoolGeometry, RemotePool]] = {}
        self.refused: dict[str, str] = {}
        self._stats = StatsRecorder()
        self._mover = Mover(batching, coalescing, self.allowed, fallback, transport, self._stats)
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
            for _, remote in self._remote.values():
                remote.close()
            try:
                self.transport.close()
            finally:
                self.thread_tuning.restore()
            for pool in self._pools.values():
                pool.store.close()
                # Only after the transport finished every copy: detach (unpin), then unmap.
                self.transport.detach_region(pool.tier)
                pool.region.close()
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
        """Validate ``buffer`` against ``geometry`` and give the pool its own tier region.

        A pool that fails validation is refused with a :class:`PoolError` naming the field;
        pools registered before or after it keep working.
        """
        with self._operation("register_pool"):
            if name in self._pools or name in self._remote:
                message = f"pool {name!r} is already registered; pick another name"
                raise PoolError(message)
            try:
                if geometry.name != name:
                    geometry = replace(geometry, name=name)
                info = validate_buffer(geometry, buffer)
                devices = self.transport.devices
                if info.device.split(":")[0] not in devices:
                    message = (
                        f"pool {name!r} lives on {info.device}, but transport "
                        f"{self.transport.name!r} moves only {', '.join(sorted(devices))} "
                        "memory; choose transport.name = 'cuda' for GPU pools"
                    )
                    raise PoolError(message)
                capacity_bytes = int(self.config.placement.capacity_bytes)
                slots = capacity_bytes // geometry.page_bytes
                if slots < 1:
                    message = (
                        f"pool {name!r}: placement.capacity_bytes ({capacity_bytes}, from "
                        f"{self.loaded.origin('placement.capacity_bytes')}) holds no page of "
                        f"{geometry.page_bytes} bytes; raise it"
                    )
                    raise PoolError(message)
            except PoolError as err:
                self.refused[name] = str(err)
                raise
            endpoint = Endpoint(info.address, info.nbytes, info.device, buffer)
            if self.transport.remote:
                strategies = {
                    "batching": self.batching,
                    "coalescing": self.coalescing,
                    "fallback": self.fallback,
                    "allowed": self.allowed,
                }
                remote = self.transport.attach_pool(name, geometry, endpoint, strategies)
                self._remote[name] = (geometry, remote)
                self.refused.pop(name, None)
                log.info("pool %r registered on a peer tier: %s", name, geometry)
                return
            tier_geometry = replace(
                geometry, name=f"{name}.tier", tokens=slots * geometry.page_size, device="cpu"
            )
            region = self.placement.open_region(f"tier:{name}", tier_geometry.nbytes)
            tier = Endpoint(region.address, tier_geometry.nbytes, "cpu", region)
            try:
                self.transport.attach_region(tier, endpoint)
            except BaseException:
                region.close()
                raise
            store = self.placement.new_store(slots)
            self._pools[name] = _Pool(geometry, endpoint, tier_geometry, region, tier, store)
            self.refused.pop(name, None)
            log.info("pool %r registered: %s, %d tier slots", name, geometry, slots)

    @property
    def pools(self) -> dict[str, PoolGeometry]:
        local = {name: pool.geometry for name, pool in self._pools.items()}
        return {**local, **{name: geo for name, (geo, _) in self._remote.items()}}

    def _name(self, name: str | None) -> str:
        if name is not None:
            return name
        names = [*self._pools, *self._remote]
        return names[0] if len(names) == 1 else "kv"

    def _peer(self, name: str | None) -> tuple[PoolGeometry, RemotePool] | None:
        return self._remote.get(self._name(name)) if self._remote else None

    def _pool(self, name: str | None) -> _Pool:
        name = self._name(name)
        pool = self._pools.get(name)
        if pool is None:
            if name in self.refused:
                raise PoolError(f"pool {name!r} was refused: {self.refused[name]}")
            known = ", ".join([*self._pools, *self._remote]) or "none"
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
            peer = self._peer(pool)
            if peer is not None:
                return peer[1].exists(keys)
            store = self._pool(pool).store
            for start, stop in self.batching.query_batches(len(keys)):
                found = store.contains_prefix(keys[start:stop])
                if found < stop - start:
                    return start + found
            return len(keys)

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
            keys = list(keys)
            peer = self._peer(pool)
            if peer is not None:
                pages = self._pages(peer[0], keys, indices)
                ok = peer[1].get(keys, pages, on_ready)
                self._stats.add(
                    pages_read=int(ok.sum()), bytes_read=int(ok.sum()) * peer[0].page_bytes
                )
                return [bool(x) for x in ok] + [False] * (len(keys) - len(ok))
            p = self._pool(pool)
            pages = self._pages(p.geometry, keys, indices)
            claim = p.store.claim(keys)
            try:
                n = len(claim.slots)
                ok = self._transfer(True, p, claim.slots, pages[:n], on_ready)
            finally:
                p.store.release(claim)
            result = [False] * len(keys)
            result[:n] = ok.tolist()
            return result

    def set(self, keys: Sequence[str], indices: Any, pool: str | None = None) -> list[bool]:
        """Store the pool pages at ``indices`` under ``keys``; True per key now present."""
        with self._operation("set"):
            keys = list(keys)
            peer = self._peer(pool)
            if peer is not None:
                pages = self._pages(peer[0], keys, indices)
                ok = peer[1].set(keys, pages)
                self._stats.add(
                    pages_written=int(ok.sum()), bytes_written=int(ok.sum()) * peer[0].page_bytes
                )
                return [bool(x) for x in ok] + [False] * (len(keys) - len(ok))
            p = self._pool(pool)
            pages = self._pages(p.geometry, keys, indices)
            reservation = p.store.reserve(keys)
            try:
                covered = len(reservation.keys)
                todo = np.flatnonzero(reservation.slots >= 0)
                moved = self._transfer(False, p, reservation.slots[todo], pages[todo], None)
                ok = np.zeros(covered, dtype=bool)
                ok[todo] = moved
            except BaseException:
                p.store.abort(reservation)
                raise
            p.store.commit(reservation, ok.tolist())
            result = [False] * len(keys)
            first: dict[str, bool] = {}
            for i in range(covered):
                key = keys[i]
                if key in first:  # a repeat within this request: as its first occurrence
                    result[i] = first[key]
                    continue
                result[i] = first[key] = bool(ok[i]) or reservation.present[i]
            return result

    def get_pools(self, requests: Mapping[str, tuple[Sequence[str], Any]]) -> dict[str, list[bool]]:
        """:meth:`get` for several pools: ``{pool: (keys, indices)}`` -> ``{pool: results}``."""
        return {name: self.get(keys, idx, name) for name, (keys, idx) in requests.items()}

    def set_pools(self, requests: Mapping[str, tuple[Sequence[str], Any]]) -> dict[str, list[bool]]:
        """:meth:`set` for several pools: ``{pool: (keys, indices)}`` -> ``{pool: results}``."""
        return {name: self.set(keys, idx, name) for name, (keys, idx) in requests.items()}

    def delete(self, keys: Sequence[str], pool: str | None = None) -> int:
        with self._operation("delete"):
            peer = self._peer(pool)
            if peer is not None:
                return peer[1].delete(keys)
            return self._pool(pool).store.delete(keys)

    def clear(self) -> None:
        """Forget every key of every pool (claimed slots are freed once released)."""
        with self._operation("clear"):
            for pool in self._pools.values():
                pool.store.clear()
            for _, remote in self._remote.values():
                remote.clear()

    def _transfer(
        self,
        read: bool,
        p: _Pool,
        slots: np.ndarray,
        pages: np.ndarray,
        on_ready: Callable[[int], None] | None,
    ) -> np.ndarray:
        """Tier slots to pool pages (read) or pool pages to tier slots; per-page success."""
        tier = (p.tier, p.tier_geometry, slots)
        pool = (p.endpoint, p.geometry, pages)
        if read:
            return self._mover.move(True, tier, pool, on_ready)
        return self._mover.move(False, pool, tier, on_ready)

    # ---- reporting ----------------------------------------------------------------------

    def stats(self) -> PipelineStats:
        pools = {}
        for name, pool in self._pools.items():
            store_stats = pool.store.stats() if not pool.store.closed else None
            pools[name] = {
                "page_bytes": pool.geometry.page_bytes,
                "slots": pool.store.capacity,
                "store": _asdict(store_stats) if store_stats is not None else None,
            }
        for name, (_, remote) in self._remote.items():
            pools[name] = {"peer": remote.stats()}
        return self._stats.snapshot(pools, self.transport.describe())

    def audit(self) -> dict[str, Any]:
        """The placement audit of every pool's tier region."""
        return {name: pool.region.audit().to_dict() for name, pool in self._pools.items()}

    def probe(self, nbytes: int, pool: str | None = None) -> None:
        """Move ``nbytes`` from the tier into the pool's first bytes with the backend's largest
        single operation, and return once they arrived.

        This is what a benchmark times as the limit of a restore (one contiguous copy through
        the same transport; one UCX message from the peer's tier). It overwrites the pool's
        first ``nbytes`` and stores nothing; keys and claims are untouched.
        """
        # Self-contained on purpose: the tier-backend seam gives every backend a
        # PoolTier.probe(nbytes) with these semantics, and this method then delegates to it.
        from .backends.dram.transports.base import CopyBatch
        from .descriptors import Descriptors
        from .errors import TransportError

        with self._operation("probe"):
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
                raise IndicesError(f"probe: expected a positive number of bytes, got {nbytes!r}")
            peer = self._peer(pool)
            if peer is not None:
                remote_probe = getattr(peer[1], "probe", None)
                if remote_probe is None:
                    message = f"transport {self.transport.name!r} has no probe for pool limits"
                    raise UnsupportedError(message)
                if not remote_probe(nbytes):
                    message = f"pool {peer[0].name!r}: the peer did not deliver {nbytes} bytes"
                    raise TransportError(message)
                return
            p = self._pool(pool)
            room = min(p.tier.nbytes, p.endpoint.nbytes)
            if nbytes > room:
                message = (
                    f"pool {p.geometry.name!r}: probe of {nbytes} bytes does not fit (tier "
                    f"{p.tier.nbytes} bytes, pool {p.endpoint.nbytes} bytes); probe at most {room}"
                )
                raise IndicesError(message)
            whole = Descriptors.from_arrays([0], [0], [nbytes])
            self.transport.submit(CopyBatch(p.tier, p.endpoint, whole)).result()


def _asdict(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__dataclass_fields__}


def build_pipeline(
    loaded: LoadedConfig | None = None, *, transport: Transport | None = None
) -> Pipeline:
    """Resolve every configured strategy and the transport once, and open a Pipeline.

    ``transport`` replaces the configured one (tests inject a faulty memory transport).
    """
    loaded = loaded or load_config()
    config = loaded.config
    pm = make_plugin_manager(config)
    registry = pm.registry

    def make(kind: str, section: Any) -> Any:
        return registry.get(kind, section.strategy).create(section, options=section.options)

    if transport is None:
        spec = registry.get("transport", config.transport.name)
        transport = spec.create(config, options=config.transport.options)
    pipeline = Pipeline(
        loaded,
        pm,
        batching=make("batching", config.batching),
        coalescing=make("coalescing", config.coalescing),
        placement=make("placement", config.placement),
        thread_tuning=make("thread_tuning", config.thread_tuning),
        fallback=make("fallback", config.fallback),
        transport=transport,
    )
    pm.call_safely("kvcr_pipeline_opened", pipeline=pipeline)
    return pipeline
