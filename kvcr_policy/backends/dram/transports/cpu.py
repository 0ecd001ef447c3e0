"""The cpu transport: descriptors copied by several threads, the GIL released while copying."""

from __future__ import annotations

import itertools
import os
from concurrent.futures import Future, ThreadPoolExecutor, wait

import numpy as np
from pydantic import BaseModel, ConfigDict

from kvcr_policy.config.fields import size_field
from kvcr_policy.config.schema import PolicyConfig
from kvcr_policy.config.tunable import tunable
from kvcr_policy.descriptors import Descriptors
from kvcr_policy.errors import TransportError
from kvcr_policy.memory.cpus import spread_thread
from kvcr_policy.values import Size

from ... import host_copy
from .base import CopyBatch, Transport, check_bounds

__all__ = ["CpuOptions", "CpuTransport"]

# Below this many bytes a batch is not worth handing to other threads.
_MIN_PARALLEL_BYTES = 4 << 20


class CpuOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    min_parallel_bytes: Size = size_field(
        _MIN_PARALLEL_BYTES,
        1 << 36,
        "Smaller batches are copied by one thread (at most 64GiB).",
        low=0,
        from_low=True,
        tuned=tunable(choices=(1 << 20, 4 << 20, 16 << 20, 64 << 20)),
    )


def _shares(d: Descriptors, parts: int) -> list[Descriptors]:
    """Cut ``d`` into at most ``parts`` consecutive pieces of about equal bytes."""
    if parts <= 1 or len(d) < 2:
        return [d]
    ends = np.cumsum(d.length)
    cuts = np.searchsorted(ends, ends[-1] * np.arange(1, parts) / parts, side="left") + 1
    bounds = [0, *sorted({int(c) for c in cuts if 0 < c < len(d)}), len(d)]
    return [d.take(np.arange(a, b)) for a, b in itertools.pairwise(bounds) if b > a]


class CpuTransport(Transport):
    """Copies host memory with ``transport.threads`` threads (0: one per core)."""

    name = "cpu"
    capabilities = frozenset({"coalesce", "split"})

    def __init__(self, config: PolicyConfig, options: CpuOptions) -> None:
        threads = config.transport.threads or os.cpu_count() or 1
        super().__init__(workers=max(1, threads))
        self.threads = threads
        self.min_parallel_bytes = options.min_parallel_bytes
        stream = config.transport.stream_min_bytes
        self.stream_from = int(stream) if stream is not None and host_copy.STREAM else 0
        self._copiers = (
            ThreadPoolExecutor(
                threads, thread_name_prefix="kvcr-cpu-copy", initializer=spread_thread
            )
            if threads > 1
            else None
        )

    def copy(self, batch: CopyBatch) -> None:
        check_bounds(batch)
        d = batch.descriptors
        dst, src, stream = batch.dst.address, batch.src.address, self.stream_from
        if self._copiers is None or d.nbytes < self.min_parallel_bytes:
            host_copy.copy_descriptors(dst, src, d, stream)
            return
        if len(d) < self.threads:
            # Few large descriptors: cut them so every thread gets a share.
            from kvcr_policy.descriptors import split

            d = split(d, max(1, -(-d.nbytes // self.threads)))
        futures: list[Future[None]] = [
            self._copiers.submit(host_copy.copy_descriptors, dst, src, part, stream)
            for part in _shares(d, self.threads)
        ]
        done, _ = wait(futures)
        errors = [f.exception() for f in done if f.exception() is not None]
        if errors:
            raise TransportError(f"cpu copy failed: {errors[0]}") from errors[0]

    def describe(self) -> dict[str, object]:
        return {
            **super().describe(),
            "threads": self.threads,
            "copy": "native" if host_copy.NATIVE else "ctypes.memmove",
            "stream_min_bytes": self.stream_from or None,
        }

    def close(self) -> None:
        super().close()
        if self._copiers is not None:
            self._copiers.shutdown(wait=True)
