"""KVCRPolicyTier: a kvcr_policy pipeline as a secondary tier of vLLM's tiered offloading.

vLLM's ``TieringOffloadingManager`` (GPU deployments, ``OffloadingConnector`` with
``TieringOffloadingSpec``) keeps a CPU primary tier and cascades every chunk it stores there to
each secondary tier; a chunk found only in a secondary tier is promoted back into the primary
before the GPU reads it. This tier is loaded out of tree::

    "secondary_tiers": [{"type": "KVCRPolicyTier",
                         "module_path": "kvcr_policy.integrations.vllm.tier",
                         "profile": "throughput", "overrides": {...}}]

The primary tier's chunk rows (the memoryview vLLM hands every tier) are registered as the
pipeline's pool, one page per chunk, so stores and promotions move bytes straight between
vLLM's shared primary region and our tier. As vLLM asks, every call is non-blocking: stores and
promotions run on a thread of their own and report through :meth:`get_finished_jobs`; a lookup
answers from memory on the in-process ``dram`` tier, and for a tier behind a socket (``host``,
``peer``) asks on a thread and answers ``RETRY`` until it knows.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, ClassVar

import numpy as np
from vllm.v1.kv_offload.base import (
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from ...geometry import opaque
from ...memory.cpus import spread_thread
from ...pipeline import build_pipeline
from .config import TIER_ORIGIN, parse_options
from .startup import load, log_start

__all__ = ["KVCRPolicyTier"]

log = logging.getLogger("kvcr_policy.integrations.vllm")

POOL = "chunks"


class KVCRPolicyTier(SecondaryTierManager):
    """See the module docstring; ``profile`` and ``overrides`` as for the connector."""

    medium: ClassVar[Medium] = Medium.CPU

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        **options: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.options = parse_options(options, origin=TIER_ORIGIN, tolerated=frozenset({"locality"}))
        self.loaded = load(self.options)
        self.pipeline = build_pipeline(self.loaded)
        rows = np.asarray(primary_kv_view).view(np.uint8)
        chunks, chunk_bytes = rows.shape
        import torch

        buffer = torch.from_numpy(rows).view(1, chunks, 1, chunk_bytes)
        geometry = opaque(POOL, chunk_bytes, chunks, layout="layer_first")
        self.pipeline.register_pool(POOL, geometry, buffer)
        digest = hashlib.blake2b(f"{tier_type}\0{chunk_bytes}".encode(), digest_size=8)
        self.prefix = f"vllm-tier-{digest.hexdigest()}:"
        self.inline = self.pipeline.backend.name == "dram"  # lookups from memory
        self._threads = ThreadPoolExecutor(
            1, thread_name_prefix="kvcr-vllm-tier", initializer=spread_thread
        )
        self._lookups = ThreadPoolExecutor(
            1, thread_name_prefix="kvcr-vllm-tier-lookup", initializer=spread_thread
        )
        self._asked: dict[OffloadKey, Future[int]] = {}
        self._lock = threading.Lock()
        self._done: list[JobResult] = []
        self._jobs: set[Future[None]] = set()
        log_start(f"vLLM secondary tier {tier_type!r}", self.options, self.loaded)

    def _key(self, key: OffloadKey) -> str:
        return self.prefix + bytes(key).hex()

    # ---- lookups --------------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self.inline:
            return LookupResult.HIT if self._present(key) else LookupResult.MISS
        asked = self._asked.get(key)
        if asked is None:
            self._asked[key] = self._lookups.submit(self._present, key)
            return LookupResult.RETRY
        if not asked.done():
            return LookupResult.RETRY
        del self._asked[key]
        return LookupResult.HIT if asked.result() else LookupResult.MISS

    def _present(self, key: OffloadKey) -> int:
        try:
            found = int(self.pipeline.exists([self._key(key)], POOL))
            return self.pipeline.admit(found, [POOL])  # a declined block is recomputed
        except Exception as err:  # a failed lookup is a miss
            log.warning("kvcr_policy: tier lookup failed: %s", err)
            return 0

    # ---- transfers ------------------------------------------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, load=True)

    def _submit(self, job: TransferJob, load: bool) -> None:
        future = self._threads.submit(self._run, job, load)
        with self._lock:
            self._jobs.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self._jobs.discard(future)

    def _run(self, job: TransferJob, load: bool) -> None:
        keys = list(job.keys)
        start = time.perf_counter()
        try:
            call = self.pipeline.get if load else self.pipeline.set
            chunks = np.asarray(job.chunk_ids, dtype=np.int64)
            done = [bool(x) for x in call([self._key(k) for k in keys], chunks, POOL)]
        except Exception as err:  # the tier failed: the job fails, never the thread
            log.warning(
                "kvcr_policy: tier %s of %d chunks failed: %s",
                "load" if load else "store",
                len(keys),
                err,
            )
            done = [False] * len(keys)
        moved = sum(done)
        result = JobResult(
            job_id=job.job_id,
            success=moved == len(keys),
            successful_keys=[k for k, ok in zip(keys, done, strict=True) if ok] if load else None,
            transfer_time=time.perf_counter() - start,
            transfer_bytes=moved * self.block_size_bytes,
        )
        with self._lock:
            self._done.append(result)

    def get_finished_jobs(self) -> list[JobResult]:
        with self._lock:
            done, self._done = self._done, []
        return done

    def has_pending_work(self) -> bool:
        with self._lock:
            return bool(self._jobs)

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        with self._lock:
            jobs = list(self._jobs)
        wait(jobs)

    def shutdown(self) -> None:
        """Wait for the transfers in flight (they touch vLLM's primary region), then close."""
        self._threads.shutdown(wait=True)
        self._lookups.shutdown(wait=True, cancel_futures=True)
        self.pipeline.close()
