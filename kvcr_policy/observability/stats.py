"""What ``Pipeline.stats()`` reports: a frozen value, read from the call ledger
(:class:`~.ledger.Ledger`) and each pool's own figures."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["PipelineStats", "host_memory"]


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


def host_memory(pools: dict[str, Any]) -> dict[str, Any]:
    """Tier bytes, pinned bytes and registration seconds summed over pools that report them."""
    reports = [p for p in pools.values() if isinstance(p, dict)]
    total = {
        key: sum(p.get(key) or 0 for p in reports)
        for key in ("tier_bytes", "pinned_bytes", "registration_s")
    }
    total["registration_s"] = round(float(total["registration_s"]), 6)
    return total
