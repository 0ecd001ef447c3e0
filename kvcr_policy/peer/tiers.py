"""The tiers a peer server holds: one region and one store per pool name and page layout.

Clients that attach the same pool name with the same page layout (``PoolGeometry.digest``)
share one tier, so an engine can restore what another engine stored. Regions come from the
server's placement strategy (huge pages, NUMA, pre-fault, as its profile says); their count
is capped, so clients cannot make the server map memory without bound.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..errors import CapacityError, PoolError
from ..geometry import PoolGeometry
from ..store import Store
from ..tier import Region

__all__ = ["Tier", "Tiers"]

log = logging.getLogger("kvcr_policy.peer.tiers")


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

    def __iter__(self) -> Any:
        return iter(list(self._tiers.values()))

    def open(self, geometry: PoolGeometry) -> Tier:
        """The tier mirroring ``geometry`` (its layout; not its token count), made on first use."""
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
        region = self._placement.open_region(f"peer:{geometry.name}", tier_geometry.nbytes)
        try:
            store = self._placement.new_store(slots)
        except BaseException:
            region.close()
            raise
        tier = Tier(geometry.name, tier_geometry, region, store, region.array)
        self._tiers[key] = tier
        log.info("tier %r opened: %d slots of %d bytes", geometry.name, slots, geometry.page_bytes)
        return tier

    def close(self) -> list[str]:
        """Close every store and region; returns the names of regions that had to leak."""
        leaked = []
        for tier in self._tiers.values():
            tier.store.close()
            tier.view = None
            tier.region.close()
            if tier.region.leaked:
                leaked.append(tier.name)
        self._tiers.clear()
        return leaked
