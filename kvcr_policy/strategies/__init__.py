"""One Protocol per strategy kind: what the pipeline calls on the objects plugins build.

Strategy objects are built once per pipeline from the frozen config; their methods run on the
data path and must stay cheap and free of hook calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from .admission import Admission, AdmissionStrategy, RestoreOutlook
from .eviction_policy import Evictable, EvictionPolicy

if TYPE_CHECKING:
    from ..descriptors import Descriptors
    from ..memory.locality import DeviceLocality
    from ..memory.region import Region

__all__ = [
    "Admission",
    "AdmissionStrategy",
    "BatchingStrategy",
    "CoalescingStrategy",
    "Evictable",
    "EvictionPolicy",
    "EvictionStrategy",
    "FallbackStrategy",
    "PlacementStrategy",
    "RestoreOutlook",
    "ThreadTuningStrategy",
    "Window",
    "follow_coalescing",
]


def follow_coalescing(mode: str, coalescing: str, off: str = "never") -> str:
    """A control's ``mode`` with its ``with_coalescing`` default resolved against
    ``coalescing.strategy = coalescing``: ``off`` (the control's upstream value, ``never``
    unless it names another) under ``none`` (the default profile's: upstream behaviour),
    ``auto`` under any strategy that coalesces; other modes as given. The cuda transport's
    gather and staging, a backend plugin's staging and the mooncake plugin's call priority
    follow this rule."""
    if mode != "with_coalescing":
        return mode
    return off if coalescing == "none" else "auto"


@dataclass(frozen=True, slots=True)
class Window:
    """Bounds on what may be in flight at once; ``None`` means unbounded."""

    batches: int | None = None
    pages: int | None = None
    bytes: int | None = None

    @property
    def bounded(self) -> bool:
        return self.batches is not None or self.pages is not None or self.bytes is not None

    def admits(
        self, batches: int, pages: int, nbytes: int, more_pages: int, more_bytes: int
    ) -> bool:
        """Whether one more batch may start; an empty window always admits one (no deadlock)."""
        if batches == 0:
            return True
        if self.batches is not None and batches + 1 > self.batches:
            return False
        if self.pages is not None and pages + more_pages > self.pages:
            return False
        return self.bytes is None or nbytes + more_bytes <= self.bytes


@runtime_checkable
class BatchingStrategy(Protocol):
    """Cuts reads and metadata queries into batches and bounds what is in flight."""

    window: Window

    def read_batches(self, n_pages: int) -> list[tuple[int, int]]:
        """``[start, stop)`` page ranges, in order, covering ``n_pages`` exactly once."""
        ...

    def query_batches(self, n_keys: int) -> list[tuple[int, int]]:
        """``[start, stop)`` key ranges, in order, covering ``n_keys`` exactly once."""
        ...


@runtime_checkable
class CoalescingStrategy(Protocol):
    """Merges and cuts transfer descriptors before they reach the transport."""

    #: Transport capabilities this strategy uses: a subset of {"coalesce", "split"}.
    needs: frozenset[str]

    def prepare(self, descriptors: Descriptors, allowed: frozenset[str]) -> Descriptors:
        """Descriptors to send, using only the ``allowed`` capabilities."""
        ...


@runtime_checkable
class PlacementStrategy(Protocol):
    """Opens the placed regions that hold a tier's pages (the backend keeps its own store)."""

    def open_region(self, name: str, size: int, device: DeviceLocality | None = None) -> Region:
        """A process-owned region of at least ``size`` bytes, placed and audited.

        ``device`` is where the pool it backs lives (a GPU and its NUMA node), None for host
        memory. It is optional for strategies: the ``dram`` backend passes it only to an
        ``open_region`` that names it, so strategies written for ``(name, size)`` still work.
        Likewise ``shared`` (a bool): ``kvcr-policy serve`` asks for a region it can hand to
        same-host clients (:meth:`~kvcr_policy.memory.Region.share`) only from a strategy whose
        ``open_region`` names it; with another strategy those clients move pages over UCX.
        """
        ...


@runtime_checkable
class ThreadTuningStrategy(Protocol):
    """Changes interpreter thread switching while a pipeline is open."""

    def apply(self) -> None:
        """Called once when a pipeline opens."""
        ...

    def restore(self) -> None:
        """Called once when the pipeline closes; undoes :meth:`apply`."""
        ...


@runtime_checkable
class FallbackStrategy(Protocol):
    """Decides what a failed batch becomes."""

    def recover(self, n_pages: int, retry_page: Callable[[int], bool]) -> np.ndarray:
        """Per-page success (bool array) after a batch failed; ``retry_page(i)`` moves page i."""
        ...


@runtime_checkable
class EvictionStrategy(Protocol):
    """Makes the eviction policy of each store (one per pool's tier)."""

    def new_policy(self, capacity: int) -> EvictionPolicy:
        """A fresh policy for a store of ``capacity`` slots."""
        ...
