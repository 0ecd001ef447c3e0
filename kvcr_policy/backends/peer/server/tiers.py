"""The tiers a peer server holds: one region and one store per pool name and page layout.

Clients of one tenant that attach the same pool name with the same page layout
(``PoolGeometry.digest``) share one tier, so an engine can restore what another engine of the
same tenant stored; other tenants never see it.

A tier starts at the same offset within a 4 KiB page as the first attaching pool's buffer:
shared-memory copies (``process_vm_readv``) run at half speed when source and destination
are misaligned to each other (measured on the 2-core machine, one 1 GiB ucxx message: 12-13
GB/s mutually aligned, 6 GB/s with a 16-byte offset, 9 GB/s with 48); a numpy pool starts 16
bytes into its page, a pinned one on a page boundary, a tier region always on one.

Regions come from the server's placement strategy (huge pages, NUMA, pre-fault, as its
profile says); their count and bytes are capped per tenant, so clients cannot make the server
map memory without bound. They are shared memory (a memfd, :meth:`Region.share`) when the
strategy can make it: a same-host client of the tier's tenant then maps the tier itself and
moves pages by memory copy (see :mod:`.transfers`); nothing of another tenant is ever in it.

**What a slot costs.** The client chooses the page geometry, so pages may be a few bytes, and
each slot also costs the store's bookkeeping: its tables (25 bytes), and at worst a published
key of 1 KiB with its index, generation and eviction entries, and an evicted key of 1 KiB kept
for the metrics' miss reasons (2,523 bytes measured on CPython 3.11 with 1 KiB keys; about 300
with SGLang's 64-character keys). So each slot is charged :data:`SLOT_COST` bytes besides its
page against ``security.tenant_quota_bytes``: a tenant's tiers, bookkeeping included, never
cost more than its quota. Against ``placement.capacity_bytes`` (the tier's size, which a
benchmark sets to exactly its pages) a page smaller than :data:`SLOT_COST` counts as
:data:`SLOT_COST`, so a tier's bookkeeping never costs more than its region: at most twice
``capacity_bytes`` per tier, whatever the pages.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvcr_policy.errors import CapacityError
from kvcr_policy.geometry import PoolGeometry

from ....memory.region import Region
from ...dram.store import Store
from ...dram.stores import new_store, takes
from ...reporting import TierUsage
from .labels import TierLabels

__all__ = ["SLOT_COST", "Tier", "Tiers", "tier_bytes"]

log = logging.getLogger("kvcr_policy.backends.peer.server.tiers")

#: Bytes of bookkeeping a tier's slot is charged besides its page (see the module docstring).
SLOT_COST = 3 << 10


def tier_bytes(pages: int, page_bytes: int) -> int:
    """The ``placement.capacity_bytes`` a server needs for a tier of ``pages`` pages of
    ``page_bytes`` each (a page smaller than :data:`SLOT_COST` counts as SLOT_COST)."""
    return pages * max(page_bytes, SLOT_COST)


@dataclass(slots=True)
class Tier:
    """One pool's tier on the server: its page layout, region, store and byte view."""

    name: str
    geometry: PoolGeometry  # tokens = slots * page_size, device cpu
    region: Region
    store: Store
    view: np.ndarray | None  # region.array; dropped before the region closes
    #: ``(fd, offset)``: the region's memfd and where the tier's pages start in it (None: the
    #: placement strategy keeps its regions private; no shared-memory session can attach).
    share: tuple[int, int] | None = None

    @property
    def slots(self) -> int:
        return self.store.capacity

    @property
    def cost(self) -> int:
        """What the tier is charged against its tenant's quota: pages and bookkeeping."""
        return self.slots * (self.geometry.page_bytes + SLOT_COST)

    def usage(self) -> TierUsage:
        """Capacity, bytes in use and evictions, for the server's metrics."""
        s = self.store.stats()
        page_bytes = self.geometry.page_bytes
        return TierUsage(s.capacity * page_bytes, s.used * page_bytes, s.evictions)

    def stats(self) -> dict[str, Any]:
        s = self.store.stats()
        return {
            "name": self.name,
            "page_bytes": self.geometry.page_bytes,
            "layout": self.geometry.layout,
            **{field: getattr(s, field) for field in s.__dataclass_fields__},
        }


class Tiers:
    """Tiers by (tenant, pool name, layout digest); ``placement`` is a PlacementStrategy and
    ``eviction`` an EvictionStrategy (None: the stores evict as ``placement_eviction`` says).

    Each tenant has tiers of its own: a key is only ever looked up in the tiers of the tenant
    whose session names it, and a tier's slots (freed ones included) only ever hold that
    tenant's pages. A tenant may hold ``max_tiers`` tiers and map ``quota_bytes`` in all (a
    tier is cut to what is left of the quota, each slot charged :data:`SLOT_COST` more than
    its page).
    """

    def __init__(
        self,
        placement: Any,
        capacity_bytes: int,
        max_tiers: int,
        quota_bytes: int | None = None,
        eviction: Any = None,
        labels: Mapping[str, str] | None = None,
        placement_eviction: str = "lru",
    ) -> None:
        self._placement = placement
        self._eviction = eviction  # an EvictionStrategy: each tier's store gets a policy of it
        self._default_eviction = placement_eviction  # without one: placement.eviction
        self._capacity_bytes = capacity_bytes
        self._max = max_tiers
        self._quota = quota_bytes
        self._labels = TierLabels(labels)  # each tier's metrics label (.labels)
        self._tiers: dict[tuple[str, str, str], Tier] = {}
        self._lock = threading.Lock()  # guards _tiers: open() runs on a helper thread
        self._opening = threading.Lock()  # one region opens at a time, _tiers stays readable

    def __iter__(self) -> Any:
        with self._lock:
            return iter(list(self._tiers.values()))

    def of(self, tenant: str) -> list[Tier]:
        with self._lock:
            return [tier for key, tier in self._tiers.items() if key[0] == tenant]

    def by_tenant(self) -> dict[str, int]:
        """How many tiers each tenant holds."""
        counts: dict[str, int] = {}
        with self._lock:
            for tenant, _, _ in self._tiers:
                counts[tenant] = counts.get(tenant, 0) + 1
        return counts

    def find(self, tenant: str, geometry: PoolGeometry) -> Tier | None:
        with self._lock:
            return self._tiers.get((tenant, geometry.name, geometry.digest()))

    def open(self, tenant: str, geometry: PoolGeometry, align: int = 0) -> Tier:
        """``tenant``'s tier mirroring ``geometry`` (its layout; not its token count), made on
        first use at offset ``align`` (0..4095) into its first page."""
        with self._opening:
            tier = self.find(tenant, geometry)
            if tier is not None:
                return tier
            tier = self._open(tenant, geometry, align % 4096)
            with self._lock:
                self._tiers[(tenant, geometry.name, geometry.digest())] = tier
            return tier

    def _open(self, tenant: str, geometry: PoolGeometry, align: int) -> Tier:
        mine = self.of(tenant)
        if len(mine) >= self._max:
            message = (
                f"tenant {tenant!r} already holds {len(mine)} tiers on this peer "
                f"(transport.options.max_tiers = {self._max}); pool {geometry.name!r} with a "
                "new layout is refused"
            )
            raise CapacityError(message)
        page = geometry.page_bytes
        slots = self._capacity_bytes // max(page, SLOT_COST)
        left = None
        if self._quota is not None:
            left = max(0, self._quota - sum(tier.cost for tier in mine))
            slots = min(slots, left // (page + SLOT_COST))
        if slots < 1:
            quota = "" if left is None else f", {left} bytes left of its quota"
            message = (
                f"pool {geometry.name!r}: no slot for tenant {tenant!r} on this peer: a slot "
                f"costs its page of {page} bytes and {SLOT_COST} bytes of bookkeeping "
                f"(placement.capacity_bytes {self._capacity_bytes}, at least {SLOT_COST} a "
                f"slot; security.tenant_quota_bytes {self._quota}{quota})"
            )
            raise CapacityError(message)
        tier_geometry = geometry.tier(f"{geometry.name}.tier", slots)
        name, size = f"peer:{tenant}:{geometry.name}", tier_geometry.nbytes + align
        shared = takes(self._placement.open_region, "shared")
        if shared:
            region = self._placement.open_region(name, size, shared=True)
        else:
            region = self._placement.open_region(name, size)
        try:
            store = new_store(
                self._placement,
                slots,
                self._eviction,
                f"peer:{geometry.name}",
                self._default_eviction,
            )
        except BaseException:
            region.close()
            raise
        view = region.array[align : align + tier_geometry.nbytes]
        # The name labels the tier's metrics (see .labels): bounded, and a tenant's own.
        share = None
        if shared:
            fd, offset = region.share()
            share = (fd, offset + align)
        name = self._labels.tier(tenant, geometry.name)
        tier = Tier(name, tier_geometry, region, store, view, share)
        log.info(
            "tier %r of tenant %r opened: %d slots of %d bytes, offset %d into its first page",
            geometry.name,
            tenant,
            slots,
            geometry.page_bytes,
            align,
        )
        return tier

    def close(self) -> list[str]:
        """Close every store and region; returns the names of regions that had to leak."""
        leaked = []
        with self._lock:
            tiers = list(self._tiers.values())
            self._tiers.clear()
        for tier in tiers:
            tier.store.close()
            tier.view = None
            tier.share = None
            tier.region.close()
            if tier.region.leaked:
                leaked.append(tier.name)
        return leaked
