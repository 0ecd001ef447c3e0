"""The call ledger: what each get or set did, recorded once, read by ``stats()`` and the metrics.

The mover fills one :class:`CallCounts` per call while it runs (batches, pages, descriptors
before and after shaping, the window's peaks, pages handed to the fallback and why); when the
call ends the pipeline adds it to its :class:`Ledger` (the totals ``Pipeline.stats()`` reports)
and gives the same record to the pool's meter (:meth:`.meter.PoolMeter.record`). Nothing is
counted per page, and nothing twice.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .stats import PipelineStats, host_memory

__all__ = ["CallCounts", "Ledger", "miss_reason"]

#: The totals :class:`~.stats.PipelineStats` reports as they were summed.
_COUNTED = (
    "pages_read", "pages_written", "bytes_read", "bytes_written", "descriptors_before",
    "descriptors_after", "batches", "keys_queried",
)  # fmt: skip


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
    """One get (``read``) or set call, as the mover saw it."""

    read: bool
    #: Keys the call asked for, and those its transfer covered from the start (a get: the
    #: claimed run; a set: the reserved keys); why the keys past them missed.
    keys: int = 0
    limit: int = 0
    past: str = ""
    #: Pages that moved; a set's pages to move that did not, and its keys now present.
    pages: int = 0
    lost: int = 0
    stored: int = 0
    batches: int = 0
    #: Descriptors: plain, after coalescing (before the split), and sent (after the split).
    plain: int = 0
    coalesced: int = 0
    sent: int = 0
    #: The delivery window after each submit, ``(batches, bytes)`` in flight, and its peaks.
    windows: list[tuple[int, int]] = field(default_factory=list)
    peak_batches: int = 0
    peak_bytes: int = 0
    #: Pages handed to the fallback, by the failed batch's error class and miss reason.
    fallback: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: The miss reason of the last batch that failed.
    failure: str = "transport_error"
    #: The exception the call raised, if it did.
    error: BaseException | None = None

    def window(self, batches: int, nbytes: int) -> None:
        """One batch was submitted with ``batches`` batches and ``nbytes`` bytes in flight."""
        self.batches += 1
        self.windows.append((batches, nbytes))
        self.peak_batches = max(self.peak_batches, batches)
        self.peak_bytes = max(self.peak_bytes, nbytes)

    def failed(self, err: BaseException, pages: int) -> None:
        """A batch of ``pages`` pages raised ``err``: its pages go to the fallback."""
        self.failure = reason = miss_reason(err)
        self.fallback[type(err).__name__, reason] += pages


class Ledger:
    """A pipeline's totals since it opened: every call's :class:`CallCounts`, the keys its
    ``exists`` calls asked for, and the seconds of every public call; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._peaks: Counter[str] = Counter()
        self._fallbacks: Counter[str] = Counter()
        self._seconds: dict[str, float] = {}
        self._calls: Counter[str] = Counter()

    def record(self, call: CallCounts, page_bytes: int) -> None:
        """Add one get or set call."""
        side = "read" if call.read else "written"
        with self._lock:
            c = self._counts
            c[f"pages_{side}"] += call.pages
            c[f"bytes_{side}"] += call.pages * page_bytes
            c["descriptors_before"] += call.plain
            c["descriptors_after"] += call.sent
            c["batches"] += call.batches
            for (error, _), pages in call.fallback.items():
                self._fallbacks[error] += pages
            peaks = self._peaks
            peaks["inflight_batches"] = max(peaks["inflight_batches"], call.peak_batches)
            peaks["inflight_bytes"] = max(peaks["inflight_bytes"], call.peak_bytes)

    def queried(self, keys: int) -> None:
        """An ``exists`` call asked for ``keys`` keys."""
        with self._lock:
            self._counts["keys_queried"] += keys

    def timed(self, call: str, seconds: float) -> None:
        with self._lock:
            self._seconds[call] = self._seconds.get(call, 0.0) + seconds
            self._calls[call] += 1

    def snapshot(self, pools: dict[str, Any], transport: dict[str, Any]) -> PipelineStats:
        with self._lock:
            return PipelineStats(
                **{name: self._counts[name] for name in _COUNTED},
                peak_inflight_batches=self._peaks["inflight_batches"],
                peak_inflight_bytes=self._peaks["inflight_bytes"],
                fallbacks=dict(self._fallbacks),
                seconds={k: round(v, 6) for k, v in self._seconds.items()},
                calls=dict(self._calls),
                pools=pools,
                transport=transport,
                memory=host_memory(pools),
            )
