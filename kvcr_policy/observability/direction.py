"""What one pool and one direction record (:class:`DirectionMeter`), a call's totals
(:class:`CallCounts`), a gauge moved by differences (:class:`Level`) and the miss reason of an
error (:func:`miss_reason`): the parts :class:`~.meter.PoolMeter` is made of."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .metrics import MISS_REASONS, Families

__all__ = ["CallCounts", "DirectionMeter", "Level", "miss_reason"]


def miss_reason(err: BaseException) -> str:
    """The miss reason (:data:`~.metrics.MISS_REASONS`) of an exception on the data path."""
    from ..errors import BackendUnavailableError, CapacityError, ClosedError, PoolError

    if isinstance(err, CapacityError):
        return "claimed"
    if isinstance(err, PoolError):
        return "pool_refused"
    if isinstance(err, BackendUnavailableError | ClosedError | ConnectionError | TimeoutError):
        return "backend_unavailable"
    return "transport_error"


@dataclass(slots=True)
class CallCounts:
    """What one get or set call moved, summed by the mover while it runs."""

    batches: int = 0
    pages: int = 0
    plain: int = 0
    coalesced: int = 0
    sent: int = 0
    #: The miss reason of the last batch that failed (its pages went to the fallback).
    failure: str = "transport_error"
    fallback: dict[str, int] = field(default_factory=dict)


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

    def window(self, batches: int, nbytes: int) -> None:
        """One batch was submitted with ``batches`` batches and ``nbytes`` bytes in flight."""
        self.inflight_batches.observe(batches)
        self.inflight_bytes.observe(nbytes)

    def call(self, counts: CallCounts, page_bytes: int) -> None:
        """One call's totals."""
        if counts.pages:
            self.pages.inc(counts.pages)
            self.bytes.inc(counts.pages * page_bytes)
        if counts.batches:
            self.batches.inc(counts.batches)
            self.plain.inc(counts.plain)
            self.coalesced.inc(counts.coalesced)
            self.sent.inc(counts.sent)
        for reason, pages in counts.fallback.items():
            self.fallback[reason].inc(pages)

    def miss(self, reason: str, pages: int) -> None:
        if pages > 0:
            self.misses[reason].inc(pages)
