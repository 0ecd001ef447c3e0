"""``--ranks N``: every tensor-parallel rank restores its shard at the same moment.

SGLang runs one process per tensor-parallel rank, each with its own host pool and storage
backend instance, and on a prefix hit every rank restores its shard at once; host memory
bandwidth, pinned-memory registration and CPU threads are shared. So the run here is N
processes (``spawn``: a CUDA context never crosses a fork), one per rank and, on ``cuda``, one
per GPU, each with its tensor-parallel shard (:mod:`.tp`), its own tier and its own pipelines
(:mod:`.rank`), moving in lockstep behind one barrier.

Figures (:mod:`.rank_figures`), for each (repeat, order, side) as in every run of the
benchmark:

- a rank's restore rate is its shard over its own restore time, and its limits its pinned copy
  of :data:`~.rank.LIMIT_BYTES` (or its shard, if smaller) and its host memory copy of as many
  bytes, taken right before, while every other rank copies too;
- the aggregate is every rank's bytes over the span from the first start to the last end (a
  rank that starts late or finishes slow counts against it), restores and limits alike, and
  ``aggregate_ratio_to_limit`` (``aggregate_ratio_to_host_copy_limit``) the median over runs
  of their ratio (:func:`~.result.ratio_to`).

A rank that fails breaks the barrier, so the others stop at their next step instead of
waiting; the run then fails with that rank's message (exit 2). The parent watches every
process, so a rank that dies without a word (killed, out of memory) fails the run too.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from .plan import Plan
from .rank import RankReport, main
from .rank_figures import aggregate
from .result import BenchResult
from .setup import BenchError
from .sides import exists_rate

__all__ = ["BARRIER_TIMEOUT_S", "aggregate", "run_ranks"]

#: Longest any rank waits for the others at one step (filling and storing a large shard on
#: a busy host included) before the run is called hung.
BARRIER_TIMEOUT_S = 900.0
# How long a rank may take to exit once it has reported (closing pipelines, unpinning tiers).
_EXIT_TIMEOUT_S = 120.0
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
