"""The ``dram`` backend: each pool's pages in a process-owned region that mirrors its layout.

Per pool, once :mod:`~kvcr_policy.memory.preflight` found that it fits the memory this process
can get, the placement strategy opens a region of ``placement.capacity_bytes`` (slots in place
of pages, so a prefix stored together restores as a few large copies once coalesced; or, when
the transport asks for ``whole_slots``, each slot one contiguous page) and a
:class:`~.store.Store` maps keys to slots. Bytes move with the configured copy transport
(``cpu`` threads, ``cuda`` streams, ``memory`` for tests). A read claims the slots of its
leading present run for the whole call (its first copies may start before, from the slots the
keys had, and are kept only where the claim found the same ones); a write reserves slots and
publishes exactly the pages that arrived (:mod:`.transfer`). Close order: the transport
finishes every copy, then each store closes, each region is detached (unpinned) and only then
unmapped.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from ...builtin.batching import least_pages
from ...descriptors import Descriptors
from ...errors import ClosedError, IndicesError, PoolError, mismatch
from ...geometry import PoolGeometry
from ...memory.locality import DeviceLocality
from ...memory.preflight import TierRequest, check_tier, mapped_bytes
from ...memory.region import Region
from ..base import BackendContext, Endpoint, PoolSpec, check_device
from ..reporting import TierUsage
from .store import Store
from .stores import new_store, takes
from .transfer import DramRead, DramWrite, EarlyRead, Side, read_early
from .transports.base import CopyBatch, Transport

log = logging.getLogger("kvcr_policy.backends.dram")

__all__ = ["DramBackend", "DramPool"]


def _asdict(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__dataclass_fields__}


class DramPool:
    """One pool's region, store and endpoints; the :class:`~..base.PoolTier` of ``dram``."""

    def __init__(
        self,
        spec: PoolSpec,
        tier_geometry: PoolGeometry,
        region: Region,
        store: Store,
        transport: Transport,
        device: DeviceLocality | None = None,
        ahead_pages: int | None = None,
        end_pages: int | None = None,
    ) -> None:
        self.name = spec.name
        #: The most pages of a read its transport may read ahead: its first batch's.
        self.ahead_pages = ahead_pages
        #: Pages of a write's first and last batches (:meth:`.Transport.end_bytes`).
        self.end_pages = end_pages
        self.geometry = spec.geometry
        self.region = region
        self.store = store
        self.transport = transport
        self.pool_side = Side(spec.endpoint, spec.geometry)
        self.tier_side = Side(Endpoint(region.address, tier_geometry.nbytes, "cpu", region),
                               tier_geometry)  # fmt: skip
        # What this pool holds on the host, read once: registrations end with the pool.
        self.pinned_bytes, self.registration_s = transport.pinned(self.tier_side.endpoint)
        self.device = device

    def contains(self, keys: Any) -> int:
        return self.store.contains_prefix(keys)

    def read(self, keys: list[str], pages: np.ndarray) -> DramRead:
        return DramRead(self, keys, pages)

    def write(self, keys: list[str], pages: np.ndarray) -> DramWrite:
        return DramWrite(self, keys, pages)

    def read_early(self, keys: list[str]) -> EarlyRead | None:
        """A read's first copies, started before the call is validated (:func:`.read_early`)."""
        return read_early(self, keys)

    def delete(self, keys: Any) -> int:
        return self.store.delete(keys)

    def clear(self) -> None:
        self.store.clear()

    def probe(self, nbytes: int) -> None:
        tier, pool = self.tier_side.endpoint, self.pool_side.endpoint
        self.transport.submit(CopyBatch(tier, pool, self._first(nbytes))).result()

    def probe_store(self, nbytes: int) -> None:
        """:meth:`probe` the other way: the pool's first ``nbytes`` into the tier's first bytes,
        one copy (a store's limit). Only while the tier holds, reserves and claims no slot
        (:meth:`.Store.idle`, which keeps it so until the copy ends): nothing stored is lost."""
        tier, pool = self.tier_side.endpoint, self.pool_side.endpoint
        whole = self._first(nbytes)
        with self.store.idle(f"pool {self.name!r}: store probe"):
            self.transport.submit(CopyBatch(pool, tier, whole)).result()

    def _first(self, nbytes: int) -> Descriptors:
        """One copy of the first ``nbytes`` of both sides; an IndicesError where they do not fit."""
        tier, pool = self.tier_side.endpoint, self.pool_side.endpoint
        room = min(tier.nbytes, pool.nbytes)
        if nbytes > room:
            message = (
                f"pool {self.name!r}: probe of {nbytes} bytes does not fit (tier {tier.nbytes} "
                f"bytes, pool {pool.nbytes} bytes); probe at most {room}"
            )
            raise IndicesError(message)
        return Descriptors.from_arrays([0], [0], [nbytes])

    def stats(self) -> dict[str, Any]:
        store = self.store.stats() if not self.store.closed else None
        return {
            "page_bytes": self.geometry.page_bytes,
            "slots": self.store.capacity,
            "eviction": self.store.eviction,
            "store": _asdict(store) if store is not None else None,
            "tier_bytes": self.tier_side.endpoint.nbytes,
            "pinned_bytes": self.pinned_bytes,
            "registration_s": round(self.registration_s, 6),
            "device": self.device.to_dict() if self.device is not None else None,
        }

    def audit(self) -> dict[str, Any] | None:
        return self.region.audit().to_dict()

    def usage(self) -> TierUsage:
        s = self.store.stats()
        page_bytes = self.geometry.page_bytes
        return TierUsage(s.capacity * page_bytes, s.used * page_bytes, s.evictions)

    def close(self) -> None:
        """After the transport finished every copy: close the store, unpin, then unmap."""
        self.store.close()
        self.transport.detach_region(self.tier_side.endpoint)
        self.region.close()


class DramBackend:
    """The built-in ``dram`` backend; see the module docstring."""

    name = "dram"

    def __init__(self, context: BackendContext, options: Any) -> None:
        transport = context.transport
        if not isinstance(transport, Transport) or transport.backend != "dram":
            name = getattr(transport, "name", type(transport).__name__)
            message = (
                f"backend 'dram' moves bytes with a copy transport (cpu, cuda, memory); "
                f"transport {name!r} is not one: choose a copy transport, or backend.name = 'auto'"
            )
            raise mismatch("transport.name", context.loaded.origin("transport.name"), message)
        self.transport = transport
        self.capabilities = transport.capabilities
        self.devices = transport.devices
        self.placement = context.placement
        self.eviction = context.eviction
        # Like pluggy's hook arguments: a placement strategy that names ``device`` in its
        # open_region gets the pool's device (to place the tier near it); others keep the
        # two-argument call they were written for.
        self._placement_takes_device = takes(self.placement.open_region, "device")
        self.loaded = context.loaded
        self._pools: list[DramPool] = []
        # Bytes of this backend's tiers that fill as pages arrive (memory.preflight's pending).
        self._pending = 0
        self._lock = threading.Lock()
        self._closed = False

    def attach(self, spec: PoolSpec) -> DramPool:
        check_device(spec, self.devices, f"transport {self.transport.name!r}")
        geometry = spec.geometry
        capacity_bytes = int(self.loaded.config.placement.capacity_bytes)
        slots = capacity_bytes // geometry.page_bytes
        if slots < 1:
            message = (
                f"pool {spec.name!r}: placement.capacity_bytes ({capacity_bytes}, from "
                f"{self.loaded.origin('placement.capacity_bytes')}) holds no page of "
                f"{geometry.page_bytes} bytes; raise it"
            )
            raise PoolError(message)
        tier_geometry = geometry.tier(f"{spec.name}.tier", slots)
        with self._lock:
            if self._closed:
                raise ClosedError("backend 'dram' is closed; build a new pipeline")
            device = self.transport.locate(spec.endpoint)
            name = f"tier:{spec.name}"
            committed = self.loaded.config.placement.prefault or self.transport.pins_regions
            request = TierRequest(
                f"the tier of pool {spec.name!r}",
                mapped_bytes(tier_geometry.nbytes),
                committed,
                self._pending,
            )
            setting = "placement.capacity_bytes"
            written = self.loaded.written.get(setting)  # echoed as the user wrote it
            check_tier(request, capacity_bytes, self.loaded.origin(setting), written=written)
            if self._placement_takes_device:
                region = self.placement.open_region(name, tier_geometry.nbytes, device=device)
            else:
                region = self.placement.open_region(name, tier_geometry.nbytes)
            tier = Endpoint(region.address, tier_geometry.nbytes, "cpu", region)
            try:
                self.transport.attach_region(tier, spec.endpoint)
            except BaseException:
                region.close()
                raise
            try:
                store = new_store(
                    self.placement,
                    slots,
                    self.eviction,
                    name,
                    self.loaded.config.placement.eviction,
                )
            except BaseException:  # no copy can touch the region yet: unpin and unmap it
                self.transport.detach_region(tier)
                region.close()
                raise
            batching = self.loaded.config.batching
            first = min(batching.first_batch_pages or batching.read_batch_pages,
                        batching.read_batch_pages)  # fmt: skip
            least = batching.read_batch_bytes  # the mover joins batches to this
            first = max(first, least_pages(least, tier_geometry.page_bytes))
            ends = self.transport.end_bytes()
            end_pages = None if ends is None else max(1, ends // tier_geometry.page_bytes)
            pool = DramPool(spec, tier_geometry, region, store, self.transport, device, first,
                            end_pages)  # fmt: skip
            self._pools.append(pool)
            self._pending += 0 if committed else request.nbytes
        return pool

    def describe(self) -> dict[str, Any]:
        return self.transport.describe()

    def close(self) -> None:
        """Wait for every copy the transport runs, then close each pool; idempotent.

        If the transport fails to close, a copy may still touch the regions: they stay mapped
        (leaked, and the error propagates) rather than being freed under a running copy. A pool
        that fails to close does not keep the others mapped: each is closed, then the first
        error propagates.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.transport.close()
        failed: list[Exception] = []
        for pool in self._pools:
            try:
                pool.close()
            except Exception as err:
                log.exception("closing pool %r failed; closing the others", pool.name)
                failed.append(err)
        if failed:
            raise failed[0]
