"""The tiers a peer server holds: one region and one store per pool name and page layout.

Clients that attach the same pool name with the same page layout (``PoolGeometry.digest``)
share one tier, so an engine can restore what another engine stored.

A tier starts at the same offset within a 4 KiB page as the first attaching pool's buffer:
shared-memory copies (``process_vm_readv``) run at half speed when source and destination
are misaligned to each other (measured on the 2-core machine, one 1 GiB ucxx message: 12-13
GB/s mutually aligned, 6 GB/s with a 16-byte offset, 9 GB/s with 48); a numpy pool starts 16
bytes into its page, a pinned one on a page boundary, a tier region always on one.

Regions come from the server's placement strategy (huge pages, NUMA, pre-fault, as its
profile says); their count is capped, so clients cannot make the server map memory without
bound.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvcr_policy.errors import CapacityError, PoolError
from kvcr_policy.geometry import PoolGeometry

from ...base import TierUsage
from ...dram.store import Store
from ...dram.tier import Region

__all__ = ["Tier", "Tiers"]

log = logging.getLogger("kvcr_policy.backends.peer.server.tiers")


@dataclass(slots=True)
class Tier:
    """One pool's tier on the server: its page layout, region, store and byte view."""

    name: str
    geometry: PoolGeometry  # tokens = slots * page_size, device cpu
    region: Region
    store: Store
    view: np.ndarray | None  # region.array; dropped before the region closes

    @property
    def slots(self) -> int:
        return self.store.capacity

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
    """Tiers by (pool name, layout digest); ``placement`` is a PlacementStrategy."""

    def __init__(self, placement: Any, capacity_bytes: int, max_tiers: int) -> None:
        self._placement = placement
        self._capacity_bytes = capacity_bytes
        self._max = max_tiers
        self._tiers: dict[tuple[str, str], Tier] = {}
        self._lock = threading.Lock()  # open() runs on a helper thread, the rest on the worker

    def __iter__(self) -> Any:
        with self._lock:
            return iter(list(self._tiers.values()))

    def find(self, geometry: PoolGeometry) -> Tier | None:
        with self._lock:
            return self._tiers.get((geometry.name, geometry.digest()))

    def open(self, geometry: PoolGeometry, align: int = 0) -> Tier:
        """The tier mirroring ``geometry`` (its layout; not its token count), made on first use
        at offset ``align`` (0..4095) into its first page."""
        with self._lock:
            return self._open(geometry, align % 4096)

    def _open(self, geometry: PoolGeometry, align: int) -> Tier:
        key = (geometry.name, geometry.digest())
        tier = self._tiers.get(key)
        if tier is not None:
            return tier
        if len(self._tiers) >= self._max:
            message = (
                f"this peer already holds {len(self._tiers)} tiers (transport.options.max_tiers"
                f" = {self._max}); pool {geometry.name!r} with a new layout is refused"
            )
            raise CapacityError(message)
        slots = self._capacity_bytes // geometry.page_bytes
        if slots < 1:
            message = (
                f"pool {geometry.name!r}: the peer's placement.capacity_bytes "
                f"({self._capacity_bytes}) holds no page of {geometry.page_bytes} bytes"
            )
            raise PoolError(message)
        tier_geometry = replace(
            geometry, name=f"{geometry.name}.tier", tokens=slots * geometry.page_size, device="cpu"
        )
        region = self._placement.open_region(f"peer:{geometry.name}", tier_geometry.nbytes + align)
        try:
            store = self._placement.new_store(slots)
        except BaseException:
            region.close()
            raise
        view = region.array[align : align + tier_geometry.nbytes]
        tier = Tier(geometry.name, tier_geometry, region, store, view)
        self._tiers[key] = tier
        log.info(
            "tier %r opened: %d slots of %d bytes, offset %d into its first page",
            geometry.name,
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
            tier.region.close()
            if tier.region.leaked:
                leaked.append(tier.name)
        return leaked
