"""The host's memory-copy limit: one large contiguous copy of the same bytes in host memory.

A backend's own limit (:meth:`~kvcr_policy.bench_adapter.BenchBackend.limit_gbps`) is the best
its transport does with the run's bytes: one contiguous copy on the ``dram`` tier, one UCX
message for a peer, one NIXL transfer for KVCR. A restore near 1 of it is as fast as that
transport goes, not as fast as the host goes: a transport held back by a socket or a polling
loop reads near 1 of its own limit far below the speed of memory. So beside it, right before
every restore and every store, the bench times :class:`HostCopy`: the same number of bytes
copied from one buffer of this process's host memory to another, cut into one contiguous share
per CPU this process may run on, each share copied by a thread of its own with the project's
native copy loop (non-temporal stores where the CPU has them, as the ``cpu`` transport's large
copies), all at once. Both buffers are allocated once per run and written by an untimed copy
first, so no timed copy pays a page fault or a thread start.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..backends import host_copy as native
from ..descriptors import Descriptors
from .setup import BenchError

__all__ = ["HOST_COPY_TEXT", "HostCopy", "cpus"]

#: What the host's memory-copy limit is, in words (the JSON's ``host_copy_limit``).
HOST_COPY_TEXT = (
    "one contiguous copy of the same bytes between two buffers of this process's host memory, "
    "one share per CPU this process may run on, each by its own thread (native copy loop, "
    "non-temporal stores where available)"
)
#: No share smaller than this: below it a thread costs more than it copies.
MIN_SHARE_BYTES = 1 << 20


def cpus() -> int:
    """CPUs this process may run on (its affinity mask, which taskset and cgroups narrow)."""
    return len(os.sched_getaffinity(0))


class HostCopy:
    """Two host buffers of ``nbytes`` and the threads that copy one into the other.

    ``threads`` defaults to :func:`cpus`; fewer when the shares would fall below
    :data:`MIN_SHARE_BYTES`. Close it (or use it as a context manager) to free the buffers.
    """

    def __init__(self, nbytes: int, threads: int | None = None) -> None:
        if nbytes < 1:
            raise BenchError(f"host copy: expected a positive number of bytes, got {nbytes}")
        wanted = cpus() if threads is None else threads
        self.nbytes = nbytes
        self.threads = max(1, min(wanted, nbytes // MIN_SHARE_BYTES))
        self._src: np.ndarray | None = np.empty(nbytes, dtype=np.uint8)
        self._dst: np.ndarray | None = np.empty(nbytes, dtype=np.uint8)
        self._src.fill(0x5A)
        bounds = np.linspace(0, nbytes, self.threads + 1, dtype=np.int64)
        # Cache-line aligned cuts, so no two threads write one line.
        bounds[1:-1] -= bounds[1:-1] % 64
        self._shares = [
            Descriptors.from_arrays([a], [a], [b - a])
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
            if b > a
        ]
        self._stream = 1 if native.STREAM else 0
        self._pool = ThreadPoolExecutor(len(self._shares), thread_name_prefix="kvcr-host-copy")
        # One untimed copy: it faults in every destination page and starts every thread.
        self.copy()

    def copy(self) -> None:
        """One copy of every byte of the source buffer into the destination, every share at
        once."""
        if self._src is None or self._dst is None:
            raise BenchError("host copy: used after close()")
        src, dst = self._src.ctypes.data, self._dst.ctypes.data
        futures = [
            self._pool.submit(native.copy_descriptors, dst, src, share, self._stream)
            for share in self._shares
        ]
        for future in futures:
            future.result()

    def gbps(self) -> float:
        """GB/s of one :meth:`copy` (bytes copied over its wall time)."""
        start = time.perf_counter()
        self.copy()
        return self.nbytes / (time.perf_counter() - start) / 1e9

    def matches(self) -> bool:
        """Whether the destination holds the source's bytes (the copy really moved them)."""
        if self._src is None or self._dst is None:
            return False
        return bool(np.array_equal(self._src, self._dst))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._src = self._dst = None

    def __enter__(self) -> HostCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
