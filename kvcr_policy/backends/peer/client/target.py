"""What a transfer needs to know about one attached pool on one connection."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvcr_policy.geometry import PoolGeometry

from ...base import Endpoint

__all__ = ["Target"]


@dataclass(frozen=True, slots=True)
class Target:
    """What a transfer needs to know about one attached pool on one connection."""

    number: int  # the pool's number on the connection
    geometry: PoolGeometry  # the client pool
    tier: PoolGeometry  # the server tier (same layout, its slot count)
    view: np.ndarray  # uint8 view of the client pool
    #: The tier itself, mapped here, on a shared-memory connection (see .shared); else None.
    tier_view: np.ndarray | None = None

    @classmethod
    def make(
        cls,
        number: int,
        geometry: PoolGeometry,
        slots: int,
        view: np.ndarray,
        tier_view: np.ndarray | None = None,
    ) -> Target:
        tier = geometry.tier(f"{geometry.name}.peer", slots)
        return cls(number, geometry, tier, view, tier_view)

    @property
    def shared(self) -> bool:
        return self.tier_view is not None

    def endpoints(self) -> tuple[Endpoint, Endpoint]:
        """(tier, pool) as copy endpoints (shared-memory connections only)."""
        tier = self.tier_view
        assert tier is not None
        return _endpoint(tier), _endpoint(self.view)


def _endpoint(view: np.ndarray) -> Endpoint:
    return Endpoint(int(view.ctypes.data), len(view), "cpu", view)
