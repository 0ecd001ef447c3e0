"""Pipeline counters: collected under one lock, reported as a frozen value."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["PipelineStats", "StatsRecorder", "host_memory"]


@dataclass(frozen=True, slots=True)
class PipelineStats:
    """What a pipeline did since it opened."""

    pages_read: int = 0
    pages_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    descriptors_before: int = 0
    descriptors_after: int = 0
    batches: int = 0
    peak_inflight_batches: int = 0
    peak_inflight_bytes: int = 0
    keys_queried: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    pools: dict[str, Any] = field(default_factory=dict)
    transport: dict[str, Any] = field(default_factory=dict)
    #: What this pipeline (one rank) holds on the host, summed over its pools: tier bytes,
    #: bytes pinned for DMA and the seconds pinning took (the pools report each).
    memory: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StatsRecorder:
    """Thread-safe accumulation of the counters behind :class:`PipelineStats`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._peaks: Counter[str] = Counter()
        self._fallbacks: Counter[str] = Counter()
        self._seconds: dict[str, float] = {}
        self._calls: Counter[str] = Counter()

    def add(self, **counts: int) -> None:
        with self._lock:
            self._counts.update(counts)

    def peak(self, name: str, value: int) -> None:
        with self._lock:
            if value > self._peaks[name]:
                self._peaks[name] = value

    def fallback(self, reason: str, pages: int = 1) -> None:
        with self._lock:
            self._fallbacks[reason] += pages

    def timed(self, call: str, seconds: float) -> None:
        with self._lock:
            self._seconds[call] = self._seconds.get(call, 0.0) + seconds
            self._calls[call] += 1

    def snapshot(self, pools: dict[str, Any], transport: dict[str, Any]) -> PipelineStats:
        with self._lock:
            c = self._counts
            return PipelineStats(
                pages_read=c["pages_read"],
                pages_written=c["pages_written"],
                bytes_read=c["bytes_read"],
                bytes_written=c["bytes_written"],
                descriptors_before=c["descriptors_before"],
                descriptors_after=c["descriptors_after"],
                batches=c["batches"],
                peak_inflight_batches=self._peaks["inflight_batches"],
                peak_inflight_bytes=self._peaks["inflight_bytes"],
                keys_queried=c["keys_queried"],
                fallbacks=dict(self._fallbacks),
                seconds={k: round(v, 6) for k, v in self._seconds.items()},
                calls=dict(self._calls),
                pools=pools,
                transport=transport,
                memory=host_memory(pools),
            )


def host_memory(pools: dict[str, Any]) -> dict[str, Any]:
    """Tier bytes, pinned bytes and registration seconds summed over pools that report them."""
    reports = [p for p in pools.values() if isinstance(p, dict)]
    total = {
        key: sum(p.get(key) or 0 for p in reports)
        for key in ("tier_bytes", "pinned_bytes", "registration_s")
    }
    total["registration_s"] = round(float(total["registration_s"]), 6)
    return total
