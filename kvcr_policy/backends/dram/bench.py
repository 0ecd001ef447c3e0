"""The ``dram`` backend's benchmark adapter (registered by :mod:`.hooks`)."""

from __future__ import annotations

from kvcr_policy.bench_adapter import BenchBackend

__all__ = ["DramBench"]


class DramBench(BenchBackend):
    """The process-owned DRAM tier: nothing to start; each pipeline opens its own tier."""

    name = "dram"
    targets = frozenset({"cpu", "cuda"})
    limit_text = "one contiguous copy of the same bytes, tier -> pool, same transport"
    limit_short = "one contiguous copy, same transport"
