"""The ``file`` tier's I/O engine: batched vectored reads and writes on a bounded thread pool.

**Why a thread pool of ``preadv``/``pwritev`` and not io_uring.** CPython releases the GIL for
the whole of ``os.preadv``/``os.pwritev``, the checksum (:func:`.records.checksum`) releases it
for buffers of 32 KiB and more, and
the page copies go through :func:`~kvcr_policy.backends.host_copy.copy_descriptors` (the GIL
released once per job), so N threads keep N transfers in flight on the device with the
interpreter free. io_uring would save the threads, but no Python binding fits: the one on
PyPI (``liburing``) has one maintainer, builds each submission from Python objects under the
GIL, and io_uring itself is refused by common container runtimes (Docker's default seccomp
profile, ``kernel.io_uring_disabled``), where the tier would need this pool as a fallback
anyway. With jobs of several MiB the per-job cost of a thread hand-off (a few µs) is noise.

A batch of a read or write is cut into *runs*: slots consecutive in the slot file, spread
over the threads (:meth:`IOEngine.per_run`), at most one staging buffer each. How a run moves
depends on the tier's files (:mod:`.directory`):

- *direct* (``O_DIRECT``): one ``preadv``/``pwritev`` of the run's file bytes through a
  page-aligned staging buffer (anonymous ``mmap``: ``O_DIRECT`` needs aligned memory, and an
  engine's pool is 16- or 64-byte aligned), then one native gather or scatter between the
  buffer and the pool's fragments; a read checks each page's CRC-32C before copying it, so a
  damaged page never reaches the pool;
- *through the page cache*: chunks of iovecs straight into or out of the pool
  (:mod:`.inplace`: the kernel copies once), each page's CRC-32C taken chunk by chunk;
- *hybrid* (``direct = "auto"`` where direct I/O works): writes go through the page cache, so
  a page just stored is still in memory; a read first takes, without blocking, the run's
  leading pages the page cache holds whole (``RWF_NOWAIT``), then reads the others direct.

Staging buffers are made on demand, at most one per thread, and reused. Each read counts its
pages by the path that served them (:class:`ReadPaths`, in the tier's stats).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ...descriptors import Descriptors, coalesce
from ...errors import ClosedError
from ...geometry import PoolGeometry, fragment_offsets
from ...memory.cpus import spread_thread
from ..host_copy import copy_descriptors
from .directory import TierFiles
from .inplace import PoolSide, pool_view, read_in_place, start_writeback, write_in_place
from .reads import ReadPaths, ReadRequest
from .records import checksum

__all__ = ["IOEngine", "PoolSide", "ReadPaths", "ReadRequest", "plan_runs", "pool_view"]

#: Runs of a batch spread over the threads are at least this long (fewer, larger requests).
SPREAD_BYTES = 1 << 20


class _Buffer:
    """One page-aligned staging buffer."""

    def __init__(self, size: int) -> None:
        self.map = mmap.mmap(-1, size)
        self.array = np.frombuffer(self.map, dtype=np.uint8)
        self.view = memoryview(self.map)
        self.address = int(self.array.ctypes.data)

    def close(self) -> None:
        self.view.release()
        del self.array
        with contextlib.suppress(BufferError):  # a view outlived its job: freed at exit
            self.map.close()


def plan_runs(fslots: np.ndarray, per_run: int) -> list[np.ndarray]:
    """Positions of ``fslots`` grouped into runs of consecutive slots, each at most
    ``per_run`` long, in slot order: every position exactly once."""
    if not len(fslots):
        return []
    order = np.argsort(fslots, kind="stable")
    ordered = fslots[order]
    cuts = np.flatnonzero(np.diff(ordered) != 1) + 1
    runs: list[np.ndarray] = []
    for run in np.split(order, cuts):
        runs.extend(run[start : start + per_run] for start in range(0, len(run), per_run))
    return runs


def _descriptors(
    geometry: PoolGeometry, stride: int, pages: np.ndarray, rows: np.ndarray, to_pool: bool
) -> Descriptors:
    """Copies between rows of a staging buffer (row ``j`` at ``j * stride``, a page's
    fragments back to back) and the pool's ``pages``, page-major, coalesced."""
    planes, fragment = geometry.fragments_per_page, geometry.fragment_bytes
    pool = fragment_offsets(geometry, pages).T
    stage = np.add.outer(
        rows.astype(np.int64) * stride, np.arange(planes, dtype=np.int64) * fragment
    )
    src, dst = (stage, pool) if to_pool else (pool, stage)
    length = np.full(src.size, fragment, dtype=np.int64)
    return coalesce(Descriptors.from_arrays(src.ravel(), dst.ravel(), length))


def _whole(got: int, stride: int, page_bytes: int, count: int) -> int:
    """Leading slots of a read of ``got`` bytes whose page arrived whole."""
    return 0 if got < page_bytes else min(count, (got - page_bytes) // stride + 1)


class IOEngine:
    """Runs of one tier's transfers on ``threads`` threads; see the module docstring."""

    def __init__(self, threads: int, buffer_bytes: int) -> None:
        self.threads = threads
        self.buffer_bytes = buffer_bytes
        self._executor = ThreadPoolExecutor(
            threads, thread_name_prefix="kvcr-file-io", initializer=spread_thread
        )
        self._free: queue.SimpleQueue[_Buffer] = queue.SimpleQueue()
        self._made: list[_Buffer] = []
        self._lock = threading.Lock()
        self._closed = False

    def per_run(self, stride: int, pages: int = 0) -> int:
        """Slots one run may hold: one staging buffer's worth, at least one; for a batch of
        ``pages``, fewer, so its runs spread over the threads (each of at least
        :data:`SPREAD_BYTES`), and the checks and copies of the runs that arrived overlap
        the reads of the others."""
        most = max(1, self.buffer_bytes // stride)
        if pages <= 0:
            return most
        spread = max(-(-pages // self.threads), -(-SPREAD_BYTES // stride))
        return min(most, spread)

    def _buffer(self, stride: int) -> _Buffer:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if len(self._made) < self.threads:
                made = _Buffer(max(self.buffer_bytes, stride) // stride * stride)
                self._made.append(made)
                return made
        return self._free.get()

    def _run(self, job: Callable[[], np.ndarray]) -> Future[np.ndarray]:
        with self._lock:
            if self._closed:
                raise ClosedError("the file tier's I/O engine is closed; build a new pipeline")
            return self._executor.submit(job)

    def read(self, request: ReadRequest) -> Future[np.ndarray]:
        """Read ``request``'s run; per page whether its bytes arrived intact."""
        side, files = request.side, request.files
        in_place = side is not None and side.view is not None and files.cache >= 0

        def job() -> np.ndarray:
            pages = request.pages
            ok = np.zeros(len(pages), dtype=bool)
            done = 0
            if in_place:
                assert side is not None
                done = read_in_place(
                    files.cache,
                    files.stride,
                    side,
                    request.first,
                    pages,
                    request.crcs,
                    ok,
                    files.direct,
                )
                request.paths.add("page_cache" if files.direct else "buffered", done)
            if done < len(pages):
                ok[done:] = self._staged(request, done)
            return ok

        return self._run(job)

    def _staged(self, request: ReadRequest, done: int) -> np.ndarray:
        """The pages of ``request`` from ``done`` on, read through a staging buffer (a hybrid
        tier takes its leading cached pages first, without blocking), checked, then its good
        pages copied into the pool."""
        files, side, paths = request.files, request.side, request.paths
        first, pages, crcs = request.first + done, request.pages[done:], request.crcs[done:]
        stride, page_bytes, count = files.stride, files.page_bytes, len(pages)
        size = count * stride
        buffer = self._buffer(stride)
        try:
            cached = 0
            if files.hybrid and (side is None or side.view is None):
                try:
                    got = os.preadv(
                        files.cache, [buffer.view[:size]], first * stride, os.RWF_NOWAIT
                    )
                except OSError:  # EAGAIN: its first page is not cached
                    got = 0
                cached = _whole(got, stride, page_bytes, count)
            got = cached * stride
            if cached < count:
                with contextlib.suppress(OSError):  # an I/O error: those pages are not read
                    view = buffer.view[cached * stride : size]
                    got += os.preadv(files.data, [view], (first + cached) * stride)
            paths.add("page_cache", cached)
            paths.add("direct" if files.direct else "buffered", count - cached)
            ok = np.zeros(count, dtype=bool)
            for j in range(_whole(got, stride, page_bytes, count)):
                chunk = buffer.view[j * stride : j * stride + page_bytes]
                ok[j] = checksum(chunk) == int(crcs[j])
            if side is not None and ok.any():
                rows = np.flatnonzero(ok)
                plan = _descriptors(side.geometry, stride, pages[rows], rows, to_pool=True)
                copy_descriptors(side.address, buffer.address, plan)
            return ok
        finally:
            self._free.put(buffer)

    def write(
        self,
        files: TierFiles,
        side: PoolSide,
        first: int,
        pages: np.ndarray,
        writeback: bool = False,
    ) -> Future[np.ndarray]:
        """Write ``pages`` into slots ``first..`` (through the page cache where the tier
        keeps its pages there, starting their writeback with ``writeback``: the set will
        wait for it); the CRC-32C of each page (uint32)."""
        stride, page_bytes = files.stride, files.page_bytes
        fd = files.cache if files.cache >= 0 else files.data
        writeback = writeback and files.cache >= 0  # direct writes have no writeback
        if side.view is not None and files.cache >= 0:
            return self._run(lambda: write_in_place(fd, stride, side, first, pages, writeback))

        def job() -> np.ndarray:
            size = len(pages) * stride
            buffer = self._buffer(stride)
            try:
                rows = np.arange(len(pages))
                plan = _descriptors(side.geometry, stride, pages, rows, to_pool=False)
                copy_descriptors(buffer.address, side.address, plan)
                view = buffer.view
                crcs = [
                    checksum(view[j * stride : j * stride + page_bytes]) for j in range(len(pages))
                ]
                written = os.pwritev(fd, [view[:size]], first * stride)
                if written != size:
                    raise OSError(errno.ENOSPC, f"short write: {written} of {size} bytes")
                if writeback:
                    start_writeback(fd, first * stride, size)
                return np.array(crcs, dtype=np.uint32)
            finally:
                self._free.put(buffer)

        return self._run(job)

    def close(self) -> None:
        """Wait for every job, then free the staging buffers; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.shutdown(wait=True)
        for buffer in self._made:
            buffer.close()
        self._made.clear()
