"""``plan --trace --disk-tokens N``: what a disk level behind the DRAM tier adds.

For every DRAM capacity listed (``--capacity-tokens``) and every eviction strategy, the
replay model (:mod:`~.replay`) is run three times: DRAM alone (capacity ``C1``), and the
cascade (``backend.name = 'cascade'``: DRAM in front of ``file`` with ``C2`` tokens) bounded
from both sides:

- **at most** the hits of one tier of ``C1 + C2``: the levels never hold a block twice (a page
  leaving DRAM is demoted, a disk hit moves up);
- **at least** the hits of one tier of ``max(C1, C2)``: the disk holds every block DRAM holds.

The cascade keeps a promoted page's disk copy until the disk evicts it, so it lies between
the two; with a disk much larger than DRAM they differ little. The disk's hits are the
cascade's (upper bound) less DRAM's own; each level's restore rate is its hit bytes over the
trace's duration, set against its limit (DRAM: the link limit; disk: ``--disk-limit``, the
restore rate ``kvcr-policy bench --backend file`` measured), and ``restore_s_rank`` is the time
restores take at those limits, one after another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..strategies import EvictionStrategy
from .replay import replay
from .trace import Trace

__all__ = ["DiskLevel", "cascade_rows"]


@dataclass(frozen=True, slots=True)
class DiskLevel:
    """The disk level: its capacity in tokens and its restore rate (GB/s, or None)."""

    tokens: int
    gbps: float | None


def _seconds(nbytes: float, gbps: float | None) -> float | None:
    return nbytes / (gbps * 1e9) if gbps else None


def _share(rate: float | None, gbps: float | None) -> float | None:
    return rate / (gbps * 1e9) if rate is not None and gbps else None


def cascade_rows(
    trace: Trace,
    strategy: EvictionStrategy,
    capacities: list[int],
    disk: DiskLevel,
    per_token: int,
    dram_gbps: float | None,
) -> list[dict[str, Any]]:
    """One row per DRAM capacity (tokens, ascending): DRAM alone against DRAM + disk."""
    block, duration = trace.block_tokens, trace.duration_s
    rows = []
    for tokens in capacities:
        alone = replay(trace, tokens // block, strategy.new_policy(tokens // block))
        union = (tokens + disk.tokens) // block
        upper = replay(trace, union, strategy.new_policy(union))
        inner = max(tokens, disk.tokens) // block
        lower = replay(trace, inner, strategy.new_policy(inner))
        dram_bytes = alone.hit_tokens * per_token
        disk_bytes = (upper.hit_tokens - alone.hit_tokens) * per_token
        dram_rate = dram_bytes / duration if duration else None
        disk_rate = disk_bytes / duration if duration else None
        dram_s, disk_s = _seconds(dram_bytes, dram_gbps), _seconds(disk_bytes, disk.gbps)
        rows.append(
            {
                "dram_capacity_tokens": tokens,
                "disk_capacity_tokens": disk.tokens,
                "dram_alone_hit_rate": alone.hit_rate,
                "cascade_hit_rate": upper.hit_rate,
                "cascade_hit_rate_at_least": lower.hit_rate,
                "dram_hit_tokens": alone.hit_tokens,
                "disk_hit_tokens": upper.hit_tokens - alone.hit_tokens,
                "dram_restore_bytes_per_s_rank": dram_rate,
                "disk_restore_bytes_per_s_rank": disk_rate,
                "dram_limit_share": _share(dram_rate, dram_gbps),
                "disk_limit_share": _share(disk_rate, disk.gbps),
                "restore_s_rank": (
                    dram_s + disk_s if dram_s is not None and disk_s is not None else None
                ),
            }
        )
    return rows
