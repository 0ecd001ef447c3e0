"""What one pool and one direction record (:class:`DirectionMeter`) and a gauge moved by
differences (:class:`Level`): the parts :class:`~.meter.PoolMeter` is made of."""

from __future__ import annotations

from typing import Any

from .ledger import CallCounts
from .metrics import MISS_REASONS, Families

__all__ = ["DirectionMeter", "Level"]


class Level:
    """A gauge child this meter moves by differences (see the module docstring)."""

    __slots__ = ("_child", "_value")

    def __init__(self, child: Any) -> None:
        self._child = child
        self._value = 0.0

    def update(self, value: float) -> None:
        delta = value - self._value
        if delta:
            self._value = value
            self._child.inc(delta)


class DirectionMeter:
    """The children of one pool and one direction (``restore`` or ``store``)."""

    def __init__(self, f: Families, labels: tuple[str, ...], direction: str) -> None:
        moved = (*labels, direction)
        self.pages = f.pages.labels(*moved)
        self.bytes = f.bytes.labels(*moved)
        self.plain = f.descriptors_before.labels(*moved)
        self.coalesced = f.descriptors_coalesced.labels(*moved)
        self.sent = f.descriptors_split.labels(*moved)
        self.batches = f.batches.labels(*moved)
        self.inflight_batches = f.inflight_batches.labels(*moved)
        self.inflight_bytes = f.inflight_bytes.labels(*moved)
        # Every reason is created up front so that a dashboard shows zeros, not gaps.
        self.misses = {reason: f.misses.labels(*moved, reason) for reason in MISS_REASONS}
        self.fallback = {reason: f.fallback_pages.labels(*moved, reason) for reason in MISS_REASONS}

    def call(self, counts: CallCounts, page_bytes: int) -> None:
        """One call's totals, and the window after each of its submits."""
        if counts.pages:
            self.pages.inc(counts.pages)
            self.bytes.inc(counts.pages * page_bytes)
        if counts.batches:
            self.batches.inc(counts.batches)
            self.plain.inc(counts.plain)
            self.coalesced.inc(counts.coalesced)
            self.sent.inc(counts.sent)
        for batches, nbytes in counts.windows:
            self.inflight_batches.observe(batches)
            self.inflight_bytes.observe(nbytes)
        for (_, reason), pages in counts.fallback.items():
            self.fallback[reason].inc(pages)

    def miss(self, reason: str, pages: int) -> None:
        if pages > 0:
            self.misses[reason].inc(pages)
