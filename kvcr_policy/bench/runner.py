"""The one benchmark loop, the same for every target, backend and comparison.

1. Resolve the setup (:func:`~kvcr_policy.bench.resolve.resolve`): every input is checked first.
2. Open the pool and fill its source pages; remember one checksum per page.
3. Open both sides (each starts its own backend instance) and store the n pages through each
   (in a random order with ``scatter``, so restores read scattered tier slots): a first store
   that fills each tier (untimed in the figures: its first moves pay one-time set-ups), then
   ``repeat`` times, in both orders, a store into the side's emptied tier, each right after
   one host memory copy of the same bytes (:mod:`.host_copy`); the figures are medians. A
   side without a pipeline of its own to empty (a peer implementation) counts its first store.
4. ``repeat`` times, in both orders (P then the baseline, the baseline then P), for each
   side: measure both limits right before the restore (the memory bandwidth of a shared
   machine drifts, so each restore is compared with its own moment): the backend's own, then
   this host's memory copy of the same bytes; poison the destination pages, collect garbage
   (untimed), restore them, and verify every page by checksum.
5. Metadata: ``exists`` over stored keys, per profile, on a fresh backend instance (and,
   where the comparison provides ``exists_rates``, on both of its sides the same way).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from functools import partial
from typing import Any

import numpy as np

from .host_copy import HOST_COPY_TEXT, HostCopy
from .plan import Plan
from .ranks import run_ranks
from .resolve import resolve
from .result import BenchResult, Run, setup_axes
from .setup import BenchError, BenchSetup
from .sides import bench_keys, exists_rate
from .targets import tokens_of

__all__ = ["Progress", "run_bench", "steps"]

Progress = Callable[[str], None]


def steps(setup: BenchSetup) -> int:
    """How many progress messages a run of ``setup`` says (for a progress bar)."""
    return 4 + 8 * setup.repeat


def _quiet(message: str) -> None:
    return None


def _timed(pool_sync: Callable[[], None], call: Callable[[], bool]) -> tuple[float, bool]:
    pool_sync()
    # A full garbage collection owed by earlier work (the stores, a backend's bookkeeping) would
    # otherwise land inside whichever restore comes first, always P's: measured, a 256 MiB
    # restore through the kvcr backend took 2.5x as long when it did. Pay it here, untimed.
    gc.collect()
    start = time.perf_counter()
    ok = call()
    pool_sync()
    return time.perf_counter() - start, ok


def run_bench(setup: BenchSetup, progress: Progress | None = None) -> BenchResult:
    """Run the benchmark ``setup`` describes; see the module docstring."""
    plan = resolve(setup)
    return run_plan(plan, progress or _quiet)


def _descriptors(stats: Mapping[str, Any]) -> dict[str, int]:
    """Descriptors before and after coalescing, batches and peak in flight, of one side."""
    return {
        "before": int(stats["descriptors_before"]),
        "after": int(stats["descriptors_after"]),
        "batches": int(stats["batches"]),
        "peak_inflight_batches": int(stats["peak_inflight_batches"]),
    }


def run_plan(plan: Plan, say: Progress) -> BenchResult:
    """Steps 2-5 of the module docstring, for a resolved plan (``--ranks``: :mod:`.ranks`)."""
    if plan.setup.ranks > 1:
        return run_ranks(plan, say)
    setup, measured, backend = plan.setup, plan.measured, plan.backend
    n, nbytes, base = measured.pages, measured.nbytes, plan.comparison.baseline
    keys = bench_keys(n, "bench")
    order = np.random.default_rng(0).permutation(n) if setup.scatter else np.arange(n)
    runs: list[Run] = []
    store_gbps: dict[str, float] = {}
    store_host: dict[str, float] = {}
    stores_timed: dict[str, int] = {}
    store_limit: dict[str, float] = {}
    store_ratio: dict[str, float] = {}
    with ExitStack() as stack:
        pool, sides = plan.comparison.open(stack, plan)
        say(f"filling {nbytes / 2**30:.2f} GiB of source pages (and the host copy's buffers)")
        pool.fill()
        host = stack.enter_context(HostCopy(nbytes))
        page = measured.page_size
        src = tokens_of(page, pool.src_pages[order])
        dst = tokens_of(page, pool.dst_pages)
        stored_keys = [keys[i] for i in order]
        stores: dict[str, list[tuple[float, float, float | None]]] = {s: [] for s in sides}
        first: dict[str, tuple[float, float, float | None]] = {}

        def store(label: str) -> tuple[float, float, float | None]:
            """One store into the side's empty tier: its rate, and the host copy right before
            it; before P's, the store's limit too (P's move into its emptied tier, where the
            backend has one: one limit for both sides, as a restore's is P's)."""
            side = sides[label]
            copy = host.gbps()
            limit = None
            if label == "P" and side.pipeline is not None:
                limit = backend.store_limit_gbps(side.pipeline, nbytes)
            seconds, ok = _timed(pool.sync, partial(side.store, stored_keys, src))
            if not ok:
                raise BenchError(f"{side.name!r} did not store all {n} pages; see its log")
            return nbytes / seconds / 1e9, copy, limit

        for label, side in sides.items():
            say(f"{side.name}: storing {n} pages")
            first[label] = store(label)
        for _ in range(setup.repeat):
            for labels in (("P", base), (base, "P")):
                for label in labels:
                    side = sides[label]
                    if side.pipeline is None:  # nothing of ours to empty: its first store counts
                        say(f"{side.name}: its first store counts ({','.join(labels)})")
                        continue
                    shown = ",".join(labels)
                    say(f"{side.name}: storing {n} pages into its emptied tier ({shown})")
                    side.pipeline.clear()
                    stores[label].append(store(label))
        for label, side in sides.items():
            taken = stores[label] or [first[label]]
            store_gbps[label] = float(np.median([gbps for gbps, _, _ in taken]))
            store_host[label] = float(np.median([copy for _, copy, _ in taken]))
            stores_timed[label] = len(stores[label])
            limits = [(gbps, limit) for gbps, _, limit in taken if limit is not None]
            if limits:  # P's stores over the limit measured right before each (result.py)
                store_limit[label] = float(np.median([limit for _, limit in limits]))
                store_ratio[label] = float(np.median([gbps / limit for gbps, limit in limits]))
            if setup.metrics and side.pipeline is not None:
                side.pipeline.audit()  # the placement gauges: where the stored pages are
        if "P" in store_limit:  # the baseline's stores over P's limits, their median
            store_ratio[base] = store_gbps[base] / store_limit["P"]
        limit_pipeline = sides["P"].pipeline
        if limit_pipeline is None:
            raise BenchError("side P has no pipeline to measure the limit with")
        for rep in range(setup.repeat):
            for labels in (("P", base), (base, "P")):
                for label in labels:
                    side = sides[label]
                    limit = backend.limit_gbps(limit_pipeline, nbytes)
                    copy = host.gbps()
                    pool.poison()
                    seconds, got = _timed(pool.sync, partial(side.restore, keys, dst))
                    ok = got and pool.verify()
                    gbps = nbytes / seconds / 1e9
                    shown = ",".join(labels)
                    runs.append(Run(rep, shown, side.name, label, gbps, limit, ok, copy))
                    say(
                        f"{side.name}: {gbps:.2f} GB/s, limit {limit:.2f}, host copy "
                        f"{copy:.2f} ({shown})"
                    )
        stats = {
            label: side.pipeline.stats().to_dict()
            for label, side in sides.items()
            if side.pipeline is not None
        }
        profiles = {label: {"name": side.name, "path": side.path} for label, side in sides.items()}
    say("metadata: exists over stored keys")
    # A comparison that can query its peer implementation measures both sides the same way.
    exists_rates = getattr(plan.comparison, "exists_rates", None)
    if exists_rates is not None:
        exists = exists_rates(plan)
    else:
        exists = {label: exists_rate(plan, label, name) for label, name in plan.profiles.items()}
    transport = dict(stats["P"]["transport"])
    return BenchResult(
        target=plan.target.name,
        backend=backend.name,
        **setup_axes(setup),
        pages=n,
        page_bytes=measured.page_bytes,
        nbytes=nbytes,
        baseline=base,
        runs=tuple(runs),
        limit=backend.limit_text,
        profiles=profiles,
        store_gbps=store_gbps,
        store_host_copy_gbps=store_host,
        stores_timed=stores_timed,
        store_limit_gbps=store_limit,
        store_ratio=store_ratio,
        store_limit=backend.store_limit_text,
        limit_short=backend.limit_short,
        host_copy_limit=HOST_COPY_TEXT,
        exists_keys_per_s=exists,
        descriptors={label: _descriptors(s) for label, s in stats.items()},
        transport=transport,
        extra={
            **plan.target.describe(),
            **backend.describe(transport),
            **plan.comparison.describe(),
        },
    )
