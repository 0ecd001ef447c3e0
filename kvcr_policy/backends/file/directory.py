"""One pool's directory of the ``file`` tier: its files, its lock, its format and direct I/O.

``<path>/<tenant>/<pool>-<layout digest>/`` holds::

    slots        the pages: slot i at i * stride bytes (stride: page bytes rounded up to 4 KiB)
    index        one commit record per slot (:mod:`.records`)
    format.json  the format version, page bytes and stride the files were made with
    lock         flock(2)ed while a process has the directory open (holds its pid)

A directory is used by one process at a time: a second one is refused with the pid of the
first (give each process, e.g. each tensor-parallel rank, its own path or tenant).

Direct I/O (``O_DIRECT``) bypasses the page cache, so the tier's pages do not evict the
engine's memory and reads measure the device. Not every file system has it (tmpfs refuses
the flag with EINVAL; some accept it at open(2) and fail the first transfer), so it is probed
once per directory with a real aligned write and read of a scratch file
(:func:`probe_direct`). The slot file is opened once or twice (:class:`TierFiles`):

- ``direct = "on"``: one descriptor with ``O_DIRECT``; every read and write is direct;
- ``direct = "auto"`` where the probe passes: that descriptor for reads of pages not in the
  page cache, and a buffered one (``cache``, readahead off: POSIX_FADV_RANDOM) for writes,
  which leave the pages in the page cache, and for the non-blocking reads that take them
  from there (:mod:`.inplace`). The kernel keeps both views coherent: a direct read first
  writes back dirty cached pages of its range;
- ``direct = "off"``, or ``auto`` where the probe fails: one buffered descriptor for all.
Alignment: 4096 bytes for buffers, offsets and lengths satisfies every Linux block device's
logical block size (``open(2)``, "O_DIRECT": "multiple of the logical block size").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ...errors import CapacityError, OsCallError, mismatch
from ...geometry import PoolGeometry
from ...keys import key_part
from .records import RECORD_BYTES

__all__ = [
    "ALIGN",
    "FORMAT",
    "TierFiles",
    "fit_capacity",
    "free_bytes",
    "open_files",
    "pool_directory",
    "probe_direct",
    "size_files",
    "stride_of",
]

ALIGN = 4096
FORMAT = 1
DirectMode = Literal["auto", "on", "off"]


def stride_of(page_bytes: int) -> int:
    """Bytes a slot takes in the slot file: the page rounded up to :data:`ALIGN`."""
    return -(-page_bytes // ALIGN) * ALIGN


def pool_directory(root: Path, tenant: str, geometry: PoolGeometry) -> Path:
    """Where the pages of ``geometry``'s pool live for ``tenant``."""
    return root / key_part(tenant) / f"{key_part(geometry.name)}-{geometry.digest()}"


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s file system (statvfs(3))."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def probe_direct(directory: Path) -> bool:
    """Whether ``directory``'s file system does direct I/O: one aligned write and read."""
    probe = directory / ".direct-probe"
    buffer = mmap.mmap(-1, ALIGN)  # anonymous mappings are page aligned
    try:
        fd = os.open(probe, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
    except OSError as err:
        if err.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        raise
    try:
        buffer.write(b"kvcr-direct-probe".ljust(ALIGN, b"\0"))
        return os.pwrite(fd, buffer, 0) == ALIGN and os.preadv(fd, [buffer], 0) == ALIGN
    except OSError as err:
        if err.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        raise
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
        buffer.close()


@dataclass(frozen=True, slots=True)
class TierFiles:
    """The open files of one pool's directory."""

    directory: Path
    #: The slot file: with ``O_DIRECT`` when :attr:`direct`.
    data: int
    index: int
    lock: int
    direct: bool
    page_bytes: int
    stride: int
    #: The slot file through the page cache: :attr:`data` itself when not :attr:`direct`,
    #: a second descriptor under ``direct = "auto"``, -1 under ``direct = "on"``.
    cache: int = -1

    @property
    def hybrid(self) -> bool:
        """Direct reads of what the page cache does not hold, buffered everything else."""
        return self.direct and self.cache >= 0

    def close(self) -> None:
        second = (self.cache,) if self.cache >= 0 and self.cache != self.data else ()
        for fd in (self.data, *second, self.index, self.lock):
            with contextlib.suppress(OSError):  # already closed: close() is idempotent
                os.close(fd)


def _lock(directory: Path, origin: str) -> int:
    fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        message = (
            f"file tier directory {str(directory)!r} is in use by another process (pid "
            f"{holder}); give each process its own backend.options.path or tenant"
        )
        raise mismatch("backend.options.path", origin, message) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _check_format(directory: Path, page_bytes: int, stride: int, origin: str) -> None:
    path = directory / "format.json"
    wanted = {"format": FORMAT, "page_bytes": page_bytes, "stride": stride}
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        path.write_text(json.dumps(wanted) + "\n")
        return
    except (OSError, ValueError) as err:
        found = {"unreadable": str(err)}
    if found != wanted:
        message = (
            f"file tier directory {str(directory)!r} holds another format ({found}); expected "
            f"{wanted}: remove the directory or choose another backend.options.path"
        )
        raise mismatch("backend.options.path", origin, message)


def open_files(
    directory: Path, geometry: PoolGeometry, direct: DirectMode, origin: str = "default"
) -> TierFiles:
    """Create (or reopen) ``directory`` for ``geometry``'s pages, locked for this process;
    ``origin`` says where ``backend.options.path`` came from (for messages)."""
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as err:
        raise OsCallError("mkdir", err.errno or errno.EIO, str(directory)) from err
    lock = _lock(directory, origin)
    opened = [lock]
    try:
        page_bytes = geometry.page_bytes
        stride = stride_of(page_bytes)
        _check_format(directory, page_bytes, stride, origin)
        use_direct = direct != "off" and probe_direct(directory)
        if direct == "on" and not use_direct:
            message = (
                f"backend.options.direct is 'on' but the file system of {str(directory)!r} "
                "does not do direct I/O (O_DIRECT); use 'auto' to fall back to buffered I/O"
            )
            raise mismatch("backend.options.direct", origin, message)
        flags = os.O_RDWR | os.O_CREAT | (os.O_DIRECT if use_direct else 0)
        data = os.open(directory / "slots", flags, 0o600)
        opened.append(data)
        cache = -1 if direct == "on" else data
        if use_direct and direct == "auto":
            cache = os.open(directory / "slots", os.O_RDWR)
            opened.append(cache)
            os.posix_fadvise(cache, 0, 0, os.POSIX_FADV_RANDOM)  # a miss reads no more
        index = os.open(directory / "index", os.O_RDWR | os.O_CREAT, 0o600)
    except BaseException:
        for fd in opened:
            os.close(fd)
        raise
    return TierFiles(directory, data, index, lock, use_direct, page_bytes, stride, cache)


def fit_capacity(files: TierFiles, wanted_slots: int, floor: int) -> int:
    """Slots the tier may hold: ``wanted_slots``, fewer where the file system would keep less
    than ``floor`` bytes free once the slot file holds them all (what it holds already
    counts as its own)."""
    held = os.fstat(files.data).st_blocks * 512
    room = free_bytes(files.directory) + held - floor
    slots = min(wanted_slots, max(0, room) // files.stride)
    if slots < 1:
        message = (
            f"file tier {str(files.directory)!r}: no room for one page of {files.page_bytes} "
            f"bytes above the free-space floor of {floor} bytes "
            f"(backend.options.min_free_bytes; {free_bytes(files.directory)} bytes free)"
        )
        raise CapacityError(message)
    return slots


def size_files(files: TierFiles, slots: int, preallocate: bool) -> None:
    """Give the files exactly ``slots`` slots (after recovery read what was there): the index
    sparse, the slot file allocated up front when ``preallocate`` (so later writes cannot
    cross the free-space floor)."""
    os.ftruncate(files.index, slots * RECORD_BYTES)
    os.ftruncate(files.data, slots * files.stride)
    if preallocate:
        try:
            os.posix_fallocate(files.data, 0, slots * files.stride)
        except OSError as err:
            if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise OsCallError(
                    "posix_fallocate", err.errno or errno.EIO, str(files.directory)
                ) from err
