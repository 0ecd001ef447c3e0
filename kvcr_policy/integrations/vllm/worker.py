"""The connector's worker half: loads and saves on threads of their own, between vLLM's
blocks and the tier.

A load writes only blocks vLLM allocated to a request it parked for that load; a save reads
only full prompt blocks, which never change while vLLM holds them, and vLLM holds a finished
request's blocks until :meth:`WorkerHalf.finished` reports it. So the engine's steps go on
while pages move. A page that failed to load is reported with its block and every later one
of that load (vLLM recomputes from there); a failed save only means a later miss.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ...memory.cpus import spread_thread
from .jobs import BlockJob, StepPlan, count
from .layout import POOL

__all__ = ["WorkerHalf"]

log = logging.getLogger("kvcr_policy.integrations.vllm")


class WorkerHalf:
    """See the module docstring; ``pipeline`` has vLLM's blocks registered as pool ``kv``."""

    def __init__(self, pipeline: Any, block_size: int, page_bytes: int) -> None:
        self.pipeline = pipeline
        self.block = block_size
        self.page_bytes = page_bytes
        self._loader = ThreadPoolExecutor(
            1, thread_name_prefix="kvcr-vllm-load", initializer=spread_thread
        )
        self._saver = ThreadPoolExecutor(
            1, thread_name_prefix="kvcr-vllm-save", initializer=spread_thread
        )
        self._lock = threading.Lock()
        self._pending: Counter[str] = Counter()  # transfers in flight per request
        self._loading: Counter[str] = Counter()
        self._seen: set[str] = set()  # requests vLLM holds for us once finished
        self._loaded: set[str] = set()  # loads ended, not yet reported
        self._closing: set[str] = set()  # finished requests awaiting their transfers
        self._errors: set[int] = set()
        self.stats: Counter[str] = Counter()  # since vLLM last asked
        self._step_at: float | None = None  # when the step's forward pass began

    def _indices(self, block_ids: tuple[int, ...]) -> np.ndarray:
        ids = np.asarray(block_ids, dtype=np.int64)
        return (ids[:, None] * self.block + np.arange(self.block)).ravel()

    def step_started(self) -> None:
        """vLLM is about to run a step's forward pass (it bound the step's metadata)."""
        self._step_at = time.perf_counter()

    def step_ended(self, plan: StepPlan) -> None:
        """The step's forward pass ended (``wait_for_save``): a step that only prefilled
        gives the engine's prefill, its tokens and seconds, from which the admission gate fits
        the marginal rate apart from the step's fixed cost and prefers it to a configured one
        (in this process; the stats carry each step's figures, and how many steps they sum,
        to a scheduler of its own)."""
        started, self._step_at = self._step_at, None
        if started is None or plan.prefill_tokens <= 0:
            return
        seconds = time.perf_counter() - started
        squares = plan.prefill_squares or None
        self.pipeline.prefill_observed(plan.prefill_tokens, seconds, 1, squares)
        with self._lock:
            self.stats.update(
                prefill_tokens=plan.prefill_tokens,
                prefill_us=int(seconds * 1e6),
                prefill_steps=1,
                prefill_squares=plan.prefill_squares,
            )

    def submit(self, plan: StepPlan, loads: bool) -> None:
        """Start ``plan``'s loads (``loads``) or its saves on their threads."""
        jobs = plan.loads if loads else plan.saves
        if not jobs:  # most steps: nothing to move, no lock taken
            return
        with self._lock:
            for job in jobs:
                self._pending[job.request] += 1
                self._seen.add(job.request)
                if loads:
                    self._loading[job.request] += 1
        for job in jobs:
            (self._loader if loads else self._saver).submit(self._run, job, loads)

    def _run(self, job: BlockJob, load: bool) -> None:
        start = time.perf_counter()
        try:
            call = self.pipeline.get if load else self.pipeline.set
            done = [bool(x) for x in call(list(job.keys), self._indices(job.block_ids), POOL)]
        except Exception as err:  # the tier failed: misses, never a dead thread
            log.warning(
                "kvcr_policy: %s of %d pages failed: %s",
                "load" if load else "save",
                len(job.keys),
                err,
            )
            done = [False] * len(job.keys)
        moved = done.index(False) if False in done else len(done)
        seconds = time.perf_counter() - start
        name = "load" if load else "save"
        figures = {
            f"{name}_pages": moved,
            f"{name}_bytes": moved * self.page_bytes,
            f"{name}_failed_pages": len(done) - moved,
            f"{name}_us": int(seconds * 1e6),
            f"{name}_calls": 1,  # a scheduler of its own fits a call's fixed cost apart
        }
        count(**figures)
        with self._lock:
            self.stats.update(figures)
            if load and moved < len(done):
                self._errors.update(job.block_ids[moved:])
            self._pending[job.request] -= 1
            if load:
                self._loading[job.request] -= 1
                if not self._loading[job.request]:
                    del self._loading[job.request]
                    self._loaded.add(job.request)

    def finished(self, finished: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """vLLM's ``get_finished``: requests whose held blocks are free now, and requests whose
        loads ended (with or without errors)."""
        if not (self._seen or self._loaded):  # nothing of ours in flight or held
            return None, None
        with self._lock:
            self._closing.update(finished & self._seen)
            sending = {r for r in self._closing if not self._pending[r]}
            self._closing -= sending
            for request in sending:
                self._seen.discard(request)
                self._pending.pop(request, None)
            recving, self._loaded = self._loaded, set()
        return sending or None, recving or None

    def load_errors(self) -> set[int]:
        if not self._errors:
            return set()
        with self._lock:
            errors, self._errors = self._errors, set()
        return errors

    def take_stats(self) -> dict[str, int]:
        if not self.stats:  # a step that moved and timed nothing
            return {}
        with self._lock:
            stats, self.stats = dict(self.stats), Counter()
        return stats

    def close(self) -> None:
        """Wait for the transfers in flight (they touch vLLM's memory), then stop the threads."""
        self._loader.shutdown(wait=True)
        self._saver.shutdown(wait=True)
