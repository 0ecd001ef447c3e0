"""One rank of a multi-rank run (:mod:`.ranks`): its own process, device, shard, tier, pipelines.

A rank process selects its device (GPU ``rank`` on ``cuda``), resolves the run's setup there
(its shard geometry and memory checked on its own GPU) and opens its pool and both sides as a
one-process run does. Then it moves in lockstep with the other ranks: every timed step starts
behind the run's barrier, so all ranks store, measure both limits (the backend's own, then the
host's memory copy, :mod:`.host_copy`, each rank with its share of the CPUs) and restore at the
same moment, and each records when its step started and ended on the host's monotonic clock
(``CLOCK_MONOTONIC`` is one clock for every process of a host), from which :mod:`.ranks` takes
the aggregate figures. Each rank verifies its own restored pages by checksum.

The process sends its parent ``("say", text)`` progress messages (rank 0 only), then exactly
one ``("report", RankReport)``, ``("error", text)`` or ``("aborted", text)``; a rank that fails
breaks the barrier first, so no other rank waits for it.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..errors import KVCRPolicyError
from .host_copy import HostCopy, cpus
from .resolve import resolve
from .setup import BenchError, BenchSetup
from .sides import bench_keys
from .targets import TARGETS, tokens_of
from .tp import device_of

__all__ = ["LIMIT_BYTES", "RankReport", "Step", "main"]

#: Each rank's limit copy: at most 4 GiB (one pinned host-to-device copy of 4 GiB runs at the
#: PCIe rate on an H200), all ranks at once.
LIMIT_BYTES = 4 << 30
# Audit keys a rank reports per side: where its tier's pages landed.
_PLACEMENT_KEYS = (
    "numa_policy_requested", "numa_nodes_requested", "numa_mode", "numa_policy_obtained",
    "numa_nodes_obtained", "numa_near", "pages_per_node", "huge_page_ratio", "fallbacks",
)  # fmt: skip


def now() -> float:
    """Seconds on the host-wide monotonic clock (comparable between the ranks' processes)."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@dataclass(frozen=True, slots=True)
class Step:
    """One timed step of one rank: ``kind`` is ``store``, ``store_limit``, ``limit``,
    ``host_copy`` or ``restore`` (a host copy and a store limit before a store have repeat -1
    and no order, as the store)."""

    kind: str
    repeat: int
    order: str
    side: str
    start: float
    end: float
    nbytes: int
    ok: bool

    @property
    def gbps(self) -> float:
        return self.nbytes / (self.end - self.start) / 1e9


@dataclass(frozen=True)
class RankReport:
    """What one rank measured and holds; sent to the parent once, at the end."""

    rank: int
    steps: tuple[Step, ...]
    profiles: dict[str, dict[str, str | None]]
    #: Side label -> that pipeline's ``stats()`` (descriptors, transport, pools, memory).
    stats: dict[str, dict[str, Any]]
    #: Side label -> where that side's tier pages landed (a slice of its placement audit).
    placement: dict[str, dict[str, Any]]
    #: What the target adds (``device``, ...).
    target: dict[str, Any] = field(default_factory=dict)


Barrier = Any  # multiprocessing.synchronize.Barrier (a context's Barrier() return type)
Say = Callable[[str], None]


def _step(
    barrier: Barrier, sync: Callable[[], None], call: Callable[[], Any]
) -> tuple[float, float, Any]:
    """Run ``call`` on every rank at once: idle, wait for all, time it to its completion."""
    sync()
    barrier.wait()
    start = now()
    result = call()
    sync()
    return start, now(), result


def run_rank(setup: BenchSetup, rank: int, barrier: Barrier, say: Say) -> RankReport:
    """Rank ``rank``'s part of the run; see the module docstring."""
    TARGETS[setup.target]().select(device_of(setup, rank))
    plan = resolve(setup)
    measured = plan.measured
    n, nbytes = measured.pages, measured.nbytes
    limit_bytes = min(LIMIT_BYTES, nbytes)
    keys = bench_keys(n, "bench")
    order = np.random.default_rng(0).permutation(n) if setup.scatter else np.arange(n)
    steps: list[Step] = []
    with ExitStack() as stack:
        pool, sides = plan.comparison.open(stack, plan)
        say(f"{setup.ranks} ranks: filling {nbytes / 2**30:.2f} GiB of source pages each")
        pool.fill()
        host = stack.enter_context(HostCopy(limit_bytes, max(1, cpus() // setup.ranks)))
        src = tokens_of(measured.page_size, pool.src_pages[order])
        dst = tokens_of(measured.page_size, pool.dst_pages)
        stored = [keys[i] for i in order]
        for label, side in sides.items():
            say(f"{setup.ranks} ranks: {side.name} storing {n} pages each")
            start, end, _ = _step(barrier, pool.sync, host.copy)
            steps.append(Step("host_copy", -1, "", label, start, end, limit_bytes, True))
            if label == "P" and side.pipeline is not None:  # the store's limit: P's move into
                # its still empty tier (one limit for both sides, as a restore's is P's)
                probe = partial(plan.backend.store_limit_gbps, side.pipeline, limit_bytes)
                start, end, gbps = _step(barrier, pool.sync, probe)
                if gbps is not None:
                    steps.append(Step("store_limit", -1, "", label, start, end, limit_bytes, True))
            start, end, ok = _step(barrier, pool.sync, partial(side.store, stored, src))
            if not ok:
                raise BenchError(f"rank {rank}: {side.name!r} did not store all {n} pages")
            steps.append(Step("store", -1, "", label, start, end, nbytes, True))
        pipeline = sides["P"].pipeline
        assert pipeline is not None  # a profile comparison: both sides are our pipelines
        for rep in range(setup.repeat):
            for labels in (("P", "Q"), ("Q", "P")):
                shown = ",".join(labels)
                for label in labels:
                    side = sides[label]
                    start, end, _ = _step(barrier, pool.sync, partial(pipeline.probe, limit_bytes))
                    steps.append(Step("limit", rep, shown, label, start, end, limit_bytes, True))
                    start, end, _ = _step(barrier, pool.sync, host.copy)
                    steps.append(
                        Step("host_copy", rep, shown, label, start, end, limit_bytes, True)
                    )
                    pool.poison()
                    start, end, got = _step(barrier, pool.sync, partial(side.restore, keys, dst))
                    ok = bool(got) and pool.verify()
                    step = Step("restore", rep, shown, label, start, end, nbytes, ok)
                    steps.append(step)
                    say(f"{setup.ranks} ranks: {side.name} rank 0 {step.gbps:.2f} GB/s ({shown})")
        stats, placement = {}, {}
        for label, side in sides.items():
            assert side.pipeline is not None
            stats[label] = side.pipeline.stats().to_dict()
            audit = side.pipeline.audit().get("kv", {})
            placement[label] = {key: audit.get(key) for key in _PLACEMENT_KEYS}
        profiles = {label: {"name": side.name, "path": side.path} for label, side in sides.items()}
    return RankReport(rank, tuple(steps), profiles, stats, placement, plan.target.describe())


def main(setup: BenchSetup, rank: int, barrier: Barrier, conn: Any) -> None:
    """The rank process's entry point: run, then send one report or error (module docstring)."""

    def say(message: str) -> None:
        if rank == 0:
            conn.send(("say", message))

    try:
        report = run_rank(setup, rank, barrier, say)
    except threading.BrokenBarrierError:
        conn.send(("aborted", "stopped: another rank failed or the barrier timed out"))
    except KVCRPolicyError as err:
        barrier.abort()
        conn.send(("error", str(err)))
    except BaseException as err:  # a bug: its traceback on this rank's stderr, its text sent
        barrier.abort()
        traceback.print_exc()
        conn.send(("error", f"{type(err).__name__}: {err}"))
    else:
        conn.send(("report", report))
    finally:
        conn.close()
