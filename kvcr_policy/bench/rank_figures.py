"""The figures of a ``--ranks N`` run (:mod:`.ranks`): every rank's report, aggregated.

Each timed step of every rank started behind one barrier; a moment's aggregate rate is every
rank's bytes over the span from the first start to the last end, restores and both limits
alike (the backend's own and the host's memory copy); ratios are :func:`~.result.ratio_to`'s.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .host_copy import HOST_COPY_TEXT
from .plan import Plan
from .rank import LIMIT_BYTES, RankReport, Step
from .result import BenchResult, Limit, Run, ratio_to, setup_axes
from .tp import describe_shard, device_of

__all__ = ["HOST_COPY_RANKS_TEXT", "LIMIT_TEXT", "aggregate"]

LIMIT_TEXT = (
    "every rank's copy of min(4 GiB, its shard), tier -> pool with its transport ({how}), all at "
    "once: their bytes over the span from the first start to the last end"
)
STORE_LIMIT_TEXT = (
    "every rank's move of min(4 GiB, its shard), pool -> emptied tier (Pipeline.probe_store), "
    "all at once: their bytes over the span from the first start to the last end"
)
HOST_COPY_RANKS_TEXT = (
    "every rank's host memory copy of as many bytes as its limit, all at once (their bytes over "
    "the span from the first start to the last end); each: " + HOST_COPY_TEXT
)


def _span_gbps(steps: Sequence[Step]) -> float:
    """Every step's bytes over the span from the first start to the last end."""
    span = max(s.end for s in steps) - min(s.start for s in steps)
    return sum(s.nbytes for s in steps) / span / 1e9


def _median(values: Sequence[float]) -> float:
    return round(statistics.median(values), 3)


def _moments(reports: Sequence[RankReport], kind: str) -> dict[tuple[int, str, str], list[Step]]:
    """Steps of ``kind`` grouped by (repeat, order, side), every rank's, in the order taken."""
    grouped: dict[tuple[int, str, str], list[Step]] = {}
    for report in reports:
        for step in report.steps:
            if step.kind == kind:
                grouped.setdefault((step.repeat, step.order, step.side), []).append(step)
    return grouped


def _runs(reports: Sequence[RankReport]) -> list[Run]:
    """A run per (repeat, order, side) of ``reports`` (one rank's, or every rank's at once):
    the restores and the two limits before them, each over its span."""
    limits, copies = _moments(reports, "limit"), _moments(reports, "host_copy")
    names = reports[0].profiles
    return [
        Run(rep, order, names[label]["name"] or "", label, _span_gbps(steps),
            _span_gbps(limits[(rep, order, label)]), all(s.ok for s in steps),
            _span_gbps(copies[(rep, order, label)]))
        for (rep, order, label), steps in _moments(reports, "restore").items()
    ]  # fmt: skip


def _rank_figures(report: RankReport, plan: Plan) -> dict[str, Any]:
    """One rank's medians, runs, memory and placement (the JSON's ``per_rank`` entries)."""
    runs = _runs([report])
    stores = {s.side: s.gbps for s in report.steps if s.kind == "store"}

    def restore(label: str) -> float:
        return _median([r.restore_gbps for r in runs if r.side == label])

    def ratio(label: str, limit: Limit = "limit") -> float:
        return round(ratio_to([r for r in runs if r.side == label], limit), 3)

    memory = {label: stats["memory"] for label, stats in report.stats.items()}
    pools = report.stats["P"]["pools"].get("kv", {})
    return {
        "rank": report.rank,
        "device": report.target.get("device", plan.target.name),
        "gpu": pools.get("device"),
        "bytes": plan.measured.nbytes,
        "verified": all(r.verified for r in runs),
        "restore_gigabytes_per_s": restore("P"),
        "baseline_gigabytes_per_s": restore("Q"),
        "limit_gigabytes_per_s": _median([r.limit_gbps for r in runs]),
        "ratio_to_limit": ratio("P"),
        "baseline_ratio_to_limit": ratio("Q"),
        "host_copy_limit_gigabytes_per_s": _median([r.host_copy_gbps for r in runs]),
        "ratio_to_host_copy_limit": ratio("P", "host_copy"),
        "baseline_ratio_to_host_copy_limit": ratio("Q", "host_copy"),
        "store_gigabytes_per_s": round(stores["P"], 3),
        "baseline_store_gigabytes_per_s": round(stores["Q"], 3),
        "memory": {**memory, "total": _sum_memory(memory.values())},
        "placement": report.placement,
        "runs": [r.to_dict() for r in runs],
    }


def _sum_memory(reports: Any) -> dict[str, Any]:
    reports = list(reports)
    return {
        "tier_bytes": sum(m["tier_bytes"] for m in reports),
        "pinned_bytes": sum(m["pinned_bytes"] for m in reports),
        "registration_s": round(sum(m["registration_s"] for m in reports), 6),
    }


def aggregate(plan: Plan, reports: Sequence[RankReport], exists: dict[str, float]) -> BenchResult:
    """One result from every rank's report: aggregate runs, per-rank figures, host totals."""
    setup, measured = plan.setup, plan.measured
    first = reports[0]
    runs = _runs(reports)
    stores = {
        label: _span_gbps(steps) for (_, _, label), steps in _moments(reports, "store").items()
    }
    store_copies = {  # the host copy right before each side's store (repeat -1, as the store)
        label: _span_gbps(steps)
        for (rep, _, label), steps in _moments(reports, "host_copy").items()
        if rep < 0
    }
    store_limits = {  # the backend's move into the empty tier right before each store
        label: _span_gbps(steps)
        for (_, _, label), steps in _moments(reports, "store_limit").items()
    }
    skews = [
        max(s.start for s in steps) - min(s.start for s in steps)
        for steps in _moments(reports, "restore").values()
    ]
    per_rank = [_rank_figures(report, plan) for report in reports]
    totals = [figures["memory"]["total"] for figures in per_rank]
    result = BenchResult(
        target=plan.target.name,
        backend=plan.backend.name,
        **setup_axes(setup),
        pages=measured.pages,
        page_bytes=measured.page_bytes,
        nbytes=measured.nbytes * len(reports),
        baseline="Q",
        runs=tuple(runs),
        limit=LIMIT_TEXT.format(how="pinned" if plan.target.name == "cuda" else "host memory"),
        profiles=first.profiles,
        store_gbps=stores,
        store_host_copy_gbps=store_copies,
        store_limit_gbps=store_limits,
        store_ratio={label: rate / store_limits["P"] for label, rate in stores.items()}
        if "P" in store_limits
        else {},
        store_limit=STORE_LIMIT_TEXT,
        limit_short=f"{plan.backend.limit_short}, every rank at once",
        host_copy_limit=HOST_COPY_RANKS_TEXT,
        exists_keys_per_s=exists,
        descriptors={label: _descriptors(stats) for label, stats in first.stats.items()},
        transport=dict(first.stats["P"]["transport"]),
    )
    host = _sum_memory(totals)
    host["registration_s_max"] = max(t["registration_s"] for t in totals)
    extra = {
        **first.target,
        "ranks": len(reports),
        "devices": [f"{plan.target.name}:{device_of(setup, r.rank)}" for r in reports]
        if plan.target.name == "cuda"
        else None,
        "rank_bytes": measured.nbytes,
        "limit_bytes_per_rank": min(LIMIT_BYTES, measured.nbytes),
        "shard": describe_shard(plan),
        "aggregate_gigabytes_per_s": round(result.restore_gbps("P"), 3),
        "aggregate_ratio_to_limit": round(result.ratio_to_limit("P"), 3),
        "baseline_aggregate_gigabytes_per_s": round(result.restore_gbps("Q"), 3),
        "baseline_aggregate_ratio_to_limit": round(result.ratio_to_limit("Q"), 3),
        "aggregate_ratio_to_host_copy_limit": round(result.ratio_to_host_copy_limit("P"), 3),
        "baseline_aggregate_ratio_to_host_copy_limit": round(
            result.ratio_to_host_copy_limit("Q"), 3
        ),
        "start_skew_ms": _median([1e3 * s for s in skews]),
        "host": host,
        "per_rank": per_rank,
    }
    return replace(result, extra=extra)


def _descriptors(stats: dict[str, Any]) -> dict[str, int]:
    return {
        "before": int(stats["descriptors_before"]),
        "after": int(stats["descriptors_after"]),
        "batches": int(stats["batches"]),
        "peak_inflight_batches": int(stats["peak_inflight_batches"]),
    }
