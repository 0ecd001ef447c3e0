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

A batch of a read or write is cut into *runs*: slots consecutive in the slot file, at most
one staging buffer each; each run is one ``preadv``/``pwritev`` of contiguous file bytes.
With direct I/O the run goes through a page-aligned staging buffer (anonymous ``mmap``:
``O_DIRECT`` needs aligned memory, and an engine's pool is 16- or 64-byte aligned), then one
native gather or scatter between the buffer and the pool's fragments; a read checks each
page's CRC-32C before copying it, so a damaged page never reaches the pool. With buffered
I/O the run's iovecs are the pool's fragments themselves (no staging copy: the kernel copies
between the page cache and the pool once), and a read checks each page's CRC-32C in the pool
before reporting it moved. Staging buffers are made on demand, at most one per
thread, and reused.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ...descriptors import Descriptors, coalesce
from ...errors import ClosedError
from ...geometry import PoolGeometry, fragment_offsets
from ...memory.cpus import spread_thread
from ..host_copy import copy_descriptors
from .records import checksum

__all__ = ["IOEngine", "PoolSide", "plan_runs"]


#: iovecs per preadv/pwritev (IOV_MAX is 1024 on Linux, <limits.h>).
IOV_MAX = 1024


@dataclass(frozen=True, slots=True)
class PoolSide:
    """The pool a transfer reads into or writes from: its base address and layout, and, for
    buffered files, a byte view of it (iovecs straight into the pool)."""

    address: int
    geometry: PoolGeometry
    view: memoryview | None = None


def pool_view(address: int, nbytes: int) -> memoryview:
    """A writable byte view of ``nbytes`` of memory at ``address`` (the registered pool)."""
    return memoryview((ctypes.c_char * nbytes).from_address(address)).cast("B")


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

    def per_run(self, stride: int) -> int:
        """Slots one run may hold: one staging buffer's worth, at least one."""
        return max(1, self.buffer_bytes // stride)

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

    def read(
        self,
        fd: int,
        stride: int,
        side: PoolSide | None,
        first: int,
        pages: np.ndarray,
        crcs: np.ndarray,
        page_bytes: int = 0,
    ) -> Future[np.ndarray]:
        """Read slots ``first..`` into ``pages`` of ``side``; per page whether its bytes
        arrived intact. Without a side (recovery's check) the pages are only checked."""
        if side is not None:
            page_bytes = side.geometry.page_bytes

        if side is not None and side.view is not None:
            return self._run(lambda: _read_in_place(fd, stride, side, first, pages, crcs))

        def job() -> np.ndarray:
            size = len(pages) * stride
            buffer = self._buffer(stride)
            try:
                try:
                    got = os.preadv(fd, [buffer.view[:size]], first * stride)
                except OSError:
                    return np.zeros(len(pages), dtype=bool)
                ok = np.zeros(len(pages), dtype=bool)
                for j in range(len(pages)):
                    start = j * stride
                    if start + page_bytes <= got:
                        chunk = buffer.view[start : start + page_bytes]
                        ok[j] = checksum(chunk) == int(crcs[j])
                if side is not None and ok.any():
                    rows = np.flatnonzero(ok)
                    plan = _descriptors(side.geometry, stride, pages[rows], rows, to_pool=True)
                    copy_descriptors(side.address, buffer.address, plan)
                return ok
            finally:
                self._free.put(buffer)

        return self._run(job)

    def write(
        self, fd: int, stride: int, side: PoolSide, first: int, pages: np.ndarray
    ) -> Future[np.ndarray]:
        """Write ``pages`` into slots ``first..``; the CRC-32C of each page (uint32)."""
        page_bytes = side.geometry.page_bytes
        if side.view is not None:
            return self._run(lambda: _write_in_place(fd, stride, side, first, pages))

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


def _iovecs(side: PoolSide, stride: int, pages: np.ndarray) -> tuple[list[list[memoryview]], int]:
    """Per page, the pool's fragments in slot order (and the slot's padding); the padding."""
    assert side.view is not None
    geometry, view = side.geometry, side.view
    size = geometry.fragment_bytes
    pad = stride - geometry.page_bytes
    filler = [memoryview(bytearray(pad))] if pad else []
    offsets = fragment_offsets(geometry, pages).T.tolist()
    return [[view[o : o + size] for o in row] + filler for row in offsets], pad


def _vectored(call: Callable[..., int], fd: int, iovecs: list[memoryview], offset: int) -> int:
    """One preadv/pwritev per IOV_MAX iovecs from ``offset`` on; bytes moved."""
    moved = 0
    for start in range(0, len(iovecs), IOV_MAX):
        chunk = iovecs[start : start + IOV_MAX]
        done = call(fd, chunk, offset + moved)
        moved += done
        if done < sum(len(v) for v in chunk):
            break
    return moved


def _read_in_place(
    fd: int, stride: int, side: PoolSide, first: int, pages: np.ndarray, crcs: np.ndarray
) -> np.ndarray:
    per_page, _ = _iovecs(side, stride, pages)
    flat = [v for page in per_page for v in page]
    try:
        got = _vectored(os.preadv, fd, flat, first * stride)
    except OSError:
        return np.zeros(len(pages), dtype=bool)
    ok = np.zeros(len(pages), dtype=bool)
    page_bytes = side.geometry.page_bytes
    for j, page in enumerate(per_page):
        if j * stride + page_bytes <= got:
            crc = 0
            for piece in page[: side.geometry.fragments_per_page]:
                crc = checksum(piece, crc)
            ok[j] = crc == int(crcs[j])
    return ok


def _write_in_place(
    fd: int, stride: int, side: PoolSide, first: int, pages: np.ndarray
) -> np.ndarray:
    per_page, _ = _iovecs(side, stride, pages)
    crcs = []
    for page in per_page:
        crc = 0
        for piece in page[: side.geometry.fragments_per_page]:
            crc = checksum(piece, crc)
        crcs.append(crc)
    flat = [v for page in per_page for v in page]
    size = len(pages) * stride
    written = _vectored(os.pwritev, fd, flat, first * stride)
    if written != size:
        raise OSError(errno.ENOSPC, f"short write: {written} of {size} bytes")
    return np.array(crcs, dtype=np.uint32)
