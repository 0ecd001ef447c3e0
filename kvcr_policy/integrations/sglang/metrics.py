"""Per-call samples for SGLang's ``StorageMetrics``, the object ``get_stats`` must return.

SGLang 0.5.23 logs a backend's ``get_stats()`` with ``StorageMetricsCollector.
log_storage_metrics``, which asserts a ``StorageMetrics`` (``observability/metrics_collector.py``)
and histograms its four lists: pages and GB/s per prefetch (read) and backup (write) call. The
samples are drained on each read, as Mooncake's backend does.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CallSamples", "storage_metrics"]


class CallSamples:
    """Thread-safe samples of data calls, kept only when SGLang's storage metrics are on."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._lock = threading.Lock()
        self._samples: dict[str, list[float]] = {}

    def record(self, op: str, pages: int, nbytes: int, seconds: float) -> None:
        if not self.enabled:
            return  # nobody drains them: keeping them would grow without bound
        kind = "prefetch" if op == "get" else "backup"
        gbps = nbytes / seconds / 1e9 if seconds > 0 else 0.0
        with self._lock:
            self._samples.setdefault(f"{kind}_pgs", []).append(pages)
            self._samples.setdefault(f"{kind}_bandwidth", []).append(gbps)

    def drain(self) -> dict[str, list[float]]:
        with self._lock:
            samples, self._samples = self._samples, {}
        return samples


@dataclass
class FallbackStorageMetrics:
    """StorageMetrics' fields, for when SGLang's metrics module cannot be imported."""

    prefetch_pgs: list[int] = field(default_factory=list)
    backup_pgs: list[int] = field(default_factory=list)
    prefetch_bandwidth: list[float] = field(default_factory=list)
    backup_bandwidth: list[float] = field(default_factory=list)


def storage_metrics(samples: CallSamples) -> Any:
    """A fresh StorageMetrics holding the samples drained from ``samples``."""
    try:
        from sglang.srt.observability.metrics_collector import StorageMetrics

        metrics: Any = StorageMetrics()
    except Exception:  # it imports model configs (torchvision) that a CPU test box may lack
        metrics = FallbackStorageMetrics()
    for name, values in samples.drain().items():
        getattr(metrics, name).extend(values)
    return metrics
