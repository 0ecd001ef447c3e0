"""Totals: KVCR's telemetry seam, kept as running totals for ``stats()``.

KVCR (0.1.1) records transfer bytes, blocks and durations and its state gauges into an object
the framework provides (``KVCRBindings.stats_factory``), and ``get_stats()`` hands back the
interval's object and starts a new one. :class:`Interval` is that object; :class:`Totals` folds
each interval in, so ``stats()`` shows what KVCR moved since the pool attached.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

__all__ = ["Interval", "Totals"]


def _label(name: str, labels: tuple[str, ...]) -> str:
    return f"{name}[{','.join(labels)}]" if labels else name


class Interval:
    """Implements ``kvcr.config.TelemetryStats`` for one interval."""

    def __init__(self) -> None:
        self.counters: defaultdict[str, float] = defaultdict(float)
        self.gauges: dict[str, float] = {}
        self.histograms: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0])

    def increase_counter(self, name: str, value: float, labelvalues: tuple[str, ...] = ()) -> None:
        self.counters[_label(name, labelvalues)] += value

    def set_gauge(self, name: str, value: float, labelvalues: tuple[str, ...] = ()) -> None:
        self.gauges[_label(name, labelvalues)] = value

    def observe_histogram(self, name: str, value: float, labelvalues: tuple[str, ...] = ()) -> None:
        entry = self.histograms[_label(name, labelvalues)]
        entry[0] += 1
        entry[1] += value

    def reduce(self) -> dict[str, float]:
        return {**self.counters, **self.gauges}

    def is_empty(self) -> bool:
        return not (self.counters or self.gauges or self.histograms)


class Totals:
    """Running totals of every interval folded in."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: defaultdict[str, float] = defaultdict(float)
        self.gauges: dict[str, float] = {}
        self.histograms: defaultdict[str, list[float]] = defaultdict(lambda: [0, 0.0])

    def fold(self, interval: Interval | None) -> None:
        if interval is None:
            return
        with self._lock:
            for name, value in interval.counters.items():
                self.counters[name] += value
            self.gauges.update(interval.gauges)
            for name, (count, total) in interval.histograms.items():
                entry = self.histograms[name]
                entry[0] += count
                entry[1] += total

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "counters": dict(self.counters),
                "gauges": dict(self.gauges),
                "durations": {
                    name: {"count": int(count), "seconds": total}
                    for name, (count, total) in self.histograms.items()
                },
            }
