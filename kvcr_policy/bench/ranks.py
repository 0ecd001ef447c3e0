"""``--ranks N``: every tensor-parallel rank restores its shard at the same moment.

SGLang runs one process per tensor-parallel rank, each with its own host pool and storage
backend instance, and on a prefix hit every rank restores its shard at once; host memory
bandwidth, pinned-memory registration and CPU threads are shared. So the run here is N
processes (``spawn``: a CUDA context never crosses a fork), one per rank and, on ``cuda``, one
per GPU, each with its tensor-parallel shard (:mod:`.tp`), its own tier and its own pipelines
(:mod:`.rank`), moving in lockstep behind one barrier.

Figures, for each (repeat, order, side) as in every run of the benchmark:

- a rank's restore rate is its shard over its own restore time, and its limit its pinned copy
  of :data:`~.rank.LIMIT_BYTES` (or its shard, if smaller) taken right before, while every
  other rank copies too;
- the aggregate is every rank's bytes over the span from the first start to the last end (a
  rank that starts late or finishes slow counts against it), restores and limits alike, and
  ``aggregate_ratio_to_limit`` the median over runs of their ratio.

A rank that fails breaks the barrier, so the others stop at their next step instead of
waiting; the run then fails with that rank's message (exit 2). The parent watches every
process, so a rank that dies without a word (killed, out of memory) fails the run too.
"""

from __future__ import annotations

import multiprocessing
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any

from .plan import Plan
from .rank import LIMIT_BYTES, RankReport, Step, main
from .result import BenchResult, Run
from .setup import BenchError
from .sides import exists_rate
from .tp import describe_shard, device_of

__all__ = ["BARRIER_TIMEOUT_S", "aggregate", "run_ranks"]

#: Longest any rank waits for the others at one step (filling and storing a large shard on
#: a busy host included) before the run is called hung.
BARRIER_TIMEOUT_S = 900.0
# How long a rank may take to exit once it has reported (closing pipelines, unpinning tiers).
_EXIT_TIMEOUT_S = 120.0
LIMIT_TEXT = (
    "every rank's copy of min(4 GiB, its shard), tier -> pool with its transport ({how}), all at "
    "once: their bytes over the span from the first start to the last end"
)

Entry = Callable[..., None]


def run_ranks(plan: Plan, say: Callable[[str], None], *, entry: Entry = main) -> BenchResult:
    """Run ``plan`` (its ``setup.ranks`` > 1) as one process per rank; see the module docstring.

    ``entry`` is the rank process's function (:func:`.rank.main`; tests hand in one that fails
    on purpose); it must be importable by name, as ``spawn`` pickles it so.
    """
    ranks = plan.setup.ranks
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(ranks, timeout=BARRIER_TIMEOUT_S)
    processes: list[Any] = []
    pipes: list[Connection] = []
    try:
        for rank in range(ranks):
            ours, theirs = context.Pipe(duplex=False)
            process = context.Process(
                target=entry,
                args=(plan.setup, rank, barrier, theirs),
                name=f"kvcr-bench-rank-{rank}",
                daemon=True,
            )
            process.start()
            theirs.close()  # the child holds its end: EOF here once it is gone
            processes.append(process)
            pipes.append(ours)
        reports = _collect(processes, pipes, barrier, say)
    finally:
        _stop(processes)
    say("metadata: exists over stored keys")
    exists = {label: exists_rate(plan, label, name) for label, name in plan.profiles.items()}
    return aggregate(plan, reports, exists)


def _collect(
    processes: Sequence[Any], pipes: Sequence[Connection], barrier: Any, say: Callable[[str], None]
) -> list[RankReport]:
    """Every rank's report, or BenchError with the first rank's failure."""
    pending = {pipe: rank for rank, pipe in enumerate(pipes)}
    reports: dict[int, RankReport] = {}
    failures: list[tuple[int, str, str]] = []
    while pending:
        sentinels = {processes[rank].sentinel: rank for rank in pending.values()}
        ready = wait([*pending, *sentinels])
        for pipe in [p for p in pending if p in ready or p.poll()]:
            rank = pending[pipe]
            try:
                kind, payload = pipe.recv()
            except EOFError:  # gone without a report
                kind, payload = "error", _exit_text(processes[rank])
            if kind == "say":
                say(payload)
                continue
            del pending[pipe]
            if kind == "report":
                reports[rank] = payload
            else:
                failures.append((rank, kind, payload))
                barrier.abort()
        for sentinel, rank in sentinels.items():
            pipe = pipes[rank]
            if sentinel in ready and pipe in pending and not pipe.poll():
                del pending[pipe]
                failures.append((rank, "error", _exit_text(processes[rank])))
                barrier.abort()
    if failures:
        raise BenchError(_failure_text(failures, len(pipes)))
    return [reports[rank] for rank in sorted(reports)]


def _exit_text(process: Any) -> str:
    process.join(5)
    return f"the rank process ended (exit code {process.exitcode}) before it reported"


def _failure_text(failures: list[tuple[int, str, str]], ranks: int) -> str:
    errors = [(rank, text) for rank, kind, text in failures if kind == "error"]
    if errors:
        rank, text = errors[0]
        others = "" if len(errors) == 1 else f" ({len(errors) - 1} more rank(s) failed)"
        return f"rank {rank} of {ranks}: {text}{others}"
    return (
        f"every rank stopped at a barrier, none with an error of its own: a rank waited more "
        f"than {BARRIER_TIMEOUT_S:.0f} s for the others"
    )


def _stop(processes: Sequence[Any]) -> None:
    for process in processes:
        process.join(_EXIT_TIMEOUT_S)
        if process.is_alive():  # a rank stuck past its report: do not leave it behind
            process.terminate()
            process.join(10)


# ---- figures ------------------------------------------------------------------------------


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


def _rank_figures(report: RankReport, plan: Plan) -> dict[str, Any]:
    """One rank's medians, runs, memory and placement (the JSON's ``per_rank`` entries)."""
    limits = {(s.repeat, s.order, s.side): s for s in report.steps if s.kind == "limit"}
    runs = [
        Run(s.repeat, s.order, report.profiles[s.side]["name"] or "", s.side, s.gbps,
            limits[(s.repeat, s.order, s.side)].gbps, s.ok)
        for s in report.steps
        if s.kind == "restore"
    ]  # fmt: skip
    stores = {s.side: s.gbps for s in report.steps if s.kind == "store"}

    def restore(label: str) -> float:
        return _median([r.restore_gbps for r in runs if r.side == label])

    def ratio(label: str) -> float:
        return _median([r.ratio_to_limit for r in runs if r.side == label])

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
    limits = _moments(reports, "limit")
    runs = [
        Run(rep, order, first.profiles[label]["name"] or "", label, _span_gbps(steps),
            _span_gbps(limits[(rep, order, label)]), all(s.ok for s in steps))
        for (rep, order, label), steps in _moments(reports, "restore").items()
    ]  # fmt: skip
    stores = {
        label: _span_gbps(steps) for (_, _, label), steps in _moments(reports, "store").items()
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
        geometry=setup.geometry,
        layout=setup.layout,
        mla=setup.mla,
        tokens=setup.tokens,
        pages=measured.pages,
        page_bytes=measured.page_bytes,
        nbytes=measured.nbytes * len(reports),
        scatter=setup.scatter,
        repeat=setup.repeat,
        baseline="Q",
        runs=tuple(runs),
        limit=LIMIT_TEXT.format(how="pinned" if plan.target.name == "cuda" else "host memory"),
        profiles=first.profiles,
        store_gbps=stores,
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
