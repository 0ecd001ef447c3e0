"""The process-owned DRAM tier region and the audit of where its pages really landed.

``open_region`` maps anonymous private memory (freed with the process), keeps it out of forked
children (``MADV_DONTFORK``), and applies the placement asked for, in this order: huge-page
advice, NUMA policy (``mbind``), pre-fault, audit. ``shared=True`` maps a memfd instead
(``memfd_create(2)``, ``MAP_SHARED``): the same placement, and :meth:`Region.share` hands its
file descriptor to another process of the host (``kvcr-policy serve`` gives same-host clients
their tier this way), whose own mapping keeps the memory alive after this one is gone. Huge
pages in a shared region need shmem THP (``/sys/kernel/mm/transparent_hugepage/shmem_enabled``
``advise`` or ``always``). Placement is audited, not assumed: the audit
reads back AnonHugePages from ``/proc/self/smaps`` and the node of a sample of pages from
``move_pages(2)``.

``prefer`` placement that cannot be had logs exactly one warning per region and is recorded in
``PlacementAudit.fallbacks``; ``require`` raises :class:`~kvcr_policy.errors.PlacementError`
saying what was asked, what was obtained and how to fix it.

Huge pages can only be observed once pages are faulted in, so ``huge_pages="require"`` without
``prefault`` faults in the first huge page alone to check that the kernel grants them; the rest
of the region stays lazy. ``huge_pages="prefer"`` without ``prefault`` checks nothing.

A region moves open -> closing -> closed. ``close`` waits for the caller's ``wait`` callable,
drops its own numpy view, and unmaps, unless a buffer exported from the region is still alive
(or ``wait`` raised): then the memory stays mapped for the life of the process and the region
reports ``leaked`` (a leak is better than a transfer writing into unmapped or reused memory).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import mmap
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from kvcr_policy.errors import ArgumentError, CapacityError, ClosedError, PlacementError

from . import linux as _os

__all__ = ["PlacementAudit", "Region", "open_region"]

HugePages = Literal["off", "prefer", "require"]
NumaPolicy = Literal["none", "preferred", "bind", "interleave"]
NumaMode = Literal["prefer", "require"]
RegionState = Literal["open", "closing", "closed"]

_LOG = logging.getLogger("kvcr_policy.memory.region")
# At most this many evenly spaced pages are asked about in one move_pages(2) query: enough to
# see a split across nodes, cheap (one syscall, 48 KiB of arrays) for any region size.
NUMA_SAMPLE_PAGES = 4096
_MPOL = {"preferred": _os.MPOL_PREFERRED, "bind": _os.MPOL_BIND, "interleave": _os.MPOL_INTERLEAVE}
# Mappings that must never be unmapped (see Region.close); kept alive until the process exits.
_LEAKED: list[mmap.mmap] = []
# Pre-fault works through the region this many bytes per madvise(2) call (a multiple of the
# huge page size). MADV_POPULATE_WRITE holds the process's mmap_lock (read) for its whole range,
# and any mmap or munmap elsewhere in the process (Python's allocator, a buffer of 256 KiB or
# more) waits for it, then every page fault waits behind that: measured under a CPU hog, one
# call for a 2 GiB tier froze every other thread of the process for 22 s (the peer server's
# UCX thread stopped answering heartbeats); 16 MiB calls bound that stall to a fraction of a
# second at the same total time.
PREFAULT_CHUNK = 16 << 20


@dataclass(frozen=True, slots=True)
class PlacementAudit:
    """Where a region's memory really is; ``to_dict`` gives JSON-ready data."""

    name: str
    bytes: int
    mapped_bytes: int
    state: str
    leaked: bool
    prefaulted: bool
    prefault_method: str  # "populate_write" | "touch" | "none"
    page_size: int
    huge_page_size: int
    huge_pages_requested: str
    huge_page_bytes: int  # AnonHugePages over the region, from /proc/self/smaps
    huge_pages_obtained: bool
    huge_page_ratio: float  # huge_page_bytes / mapped_bytes
    numa_policy_requested: str
    numa_nodes_requested: tuple[int, ...]
    numa_mode: str
    numa_policy_obtained: str  # read back with get_mempolicy(MPOL_F_ADDR)
    numa_nodes_obtained: tuple[int, ...]
    # node -> sampled pages there; "not_present" for untouched pages, else an errno name.
    pages_per_node: Mapping[int | str, int] = field(hash=False)
    numa_sampled_pages: int
    numa_total_pages: int
    fallbacks: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...]
    # numa_policy "gpu": which device the policy above was chosen to be near, or why none.
    numa_near: str = ""

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["pages_per_node"] = {str(k): v for k, v in self.pages_per_node.items()}
        data["fallbacks"] = [list(pair) for pair in self.fallbacks]
        for key in ("numa_nodes_requested", "numa_nodes_obtained", "warnings"):
            data[key] = list(data[key])
        return data


@dataclass(frozen=True, slots=True)
class _Request:
    size: int
    prefault: bool
    huge_pages: HugePages
    numa_policy: NumaPolicy
    numa_nodes: tuple[int, ...]
    numa_mode: NumaMode
    near: str = ""
    shared: bool = False


class Region:
    """An anonymous mmap owned by this process; built by :func:`open_region`, not directly."""

    __slots__ = (
        "_array", "_fallbacks", "_fd", "_huge_advised", "_last", "_leaked", "_lock", "_mapped",
        "_mm", "_name", "_numa_nodes", "_offset", "_prefault_method", "_req", "_state",
        "_warnings",
    )  # fmt: skip

    def __init__(
        self, name: str, req: _Request, mm: mmap.mmap, offset: int, mapped: int, fd: int = -1
    ):
        self._name, self._req, self._mm, self._fd = name, req, mm, fd
        self._offset, self._mapped = offset, mapped
        self._array: npt.NDArray[np.uint8] | None = np.frombuffer(
            mm, dtype=np.uint8, count=req.size, offset=offset
        )
        self._state: RegionState = "open"
        self._lock = threading.Lock()
        self._fallbacks: list[tuple[str, str]] = []
        self._warnings: list[str] = []
        self._huge_advised = False
        self._numa_nodes: tuple[int, ...] = ()  # the nodes mbind accepted
        self._prefault_method = "none"
        self._last: PlacementAudit | None = None
        self._leaked = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def size(self) -> int:
        """Usable bytes (``array`` length); the mapping is rounded up to whole huge pages."""
        return self._req.size

    @property
    def state(self) -> RegionState:
        return self._state

    @property
    def leaked(self) -> bool:
        """True when close() kept the memory mapped (a live view, or ``wait`` raised)."""
        return self._leaked

    @property
    def array(self) -> npt.NDArray[np.uint8]:
        """A uint8 view of the region; a view still alive at close makes the region leak."""
        if self._array is None or self._state != "open":
            raise ClosedError(
                f"tier region {self._name!r} is {self._state}: its array and address are gone; "
                "open a new region with open_region()"
            )
        return self._array

    @property
    def address(self) -> int:
        """The base pointer of the usable bytes."""
        return int(self.array.ctypes.data)

    def share(self) -> tuple[int, int]:
        """``(fd, offset)``: the memfd of a shared region and where its usable bytes start in
        it, for another process to map (send the fd over a Unix socket; it stays owned by the
        region, closed with it). ClosedError once closed; ArgumentError for a private region."""
        self.array  # noqa: B018 (raises ClosedError once closing)
        if self._fd < 0:
            raise ArgumentError(f"tier region {self._name!r} is private: open it with shared=True")
        return self._fd, self._offset

    def audit(self) -> PlacementAudit:
        """Read placement back now; after close, the last audit with the final state."""
        if self._state != "open":
            assert self._last is not None
            return dataclasses.replace(self._last, state=self._state, leaked=self.leaked)
        self._last = _audit(self)
        return self._last

    def close(self, *, wait: Callable[[], None] | None = None) -> None:
        """Call ``wait`` (in-flight users), then unmap; idempotent; leaks rather than corrupt."""
        with self._lock:
            if self._state != "open":
                return
            self._state = "closing"
        try:
            if wait is not None:
                wait()
        except BaseException:
            self._finish("wait() raised, so a transfer may still write the region")
            raise
        self._finish(None)

    def _finish(self, leak_reason: str | None) -> None:
        self._array = None  # our own export first, or mm.close() always sees it
        if leak_reason is None:
            try:
                self._mm.close()
            except BufferError:
                leak_reason = "a view of it (numpy array, memoryview) is still alive"
        if self._fd >= 0:  # a mapping (ours if leaked, or another process's) keeps the memory
            os.close(self._fd)
            self._fd = -1
        if leak_reason is not None:
            self._leaked = True
            _LEAKED.append(self._mm)
            _LOG.warning(
                "tier %r: not unmapping %d bytes: %s; the memory stays mapped until the process "
                "exits (drop every view before close() to avoid this)",
                self._name, self._mapped, leak_reason,
            )  # fmt: skip
        self._state = "closed"

    def __enter__(self) -> Region:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Region {self._name!r} {self._req.size} bytes {self._state}>"


def open_region(
    size: int,
    *,
    name: str = "tier",
    prefault: bool = False,
    huge_pages: HugePages = "off",
    numa_policy: NumaPolicy = "none",
    numa_nodes: Sequence[int] = (),
    numa_mode: NumaMode = "prefer",
    near: str = "",
    shared: bool = False,
) -> Region:
    """Map ``size`` bytes, apply the placement asked for, pre-fault if asked, and audit it.

    ``near`` says which device the NUMA policy was chosen for (placement's ``"gpu"``); it is
    reported by the audit as ``numa_near``. ``shared``: a memfd another process can map (see
    the module docstring and :meth:`Region.share`).
    """
    req = _validate(size, prefault, huge_pages, numa_policy, numa_nodes, numa_mode)
    req = dataclasses.replace(req, near=near, shared=bool(shared))
    region = _map(name, req)
    try:
        try:
            _os.madvise(region._mm, _os.MADV_DONTFORK)
        except OSError as err:
            region._warnings.append(f"MADV_DONTFORK failed, forked children share it: {err}")
        if huge_pages != "off":
            _advise_huge(region)
        if numa_policy != "none":
            _apply_numa(region)
        _prefault(region)
        first = _audit(region)
        _check_obtained(region, first)
    except BaseException:
        region._finish(None)
        raise
    if region._fallbacks or region._warnings:
        what = [f"{k}: {why}" for k, why in region._fallbacks] + region._warnings
        region._warnings.insert(0, f"tier {name!r}: placement not as asked: " + "; ".join(what))
        _LOG.warning("%s", region._warnings[0])
    # One smaps read per open (tens of ms in a large process): the check's audit, with the
    # fallbacks and warnings it recorded.
    region._last = dataclasses.replace(
        first, fallbacks=tuple(region._fallbacks), warnings=tuple(region._warnings)
    )
    return region


def _validate(
    size: int, prefault: bool, huge: str, policy: str, nodes: Sequence[int], mode: str
) -> _Request:
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ArgumentError(f"size must be a positive int (bytes), got {size!r}")
    for what, got, allowed in (
        ("huge_pages", huge, ("off", "prefer", "require")),
        ("numa_policy", policy, ("none", "preferred", "bind", "interleave")),
        ("numa_mode", mode, ("prefer", "require")),
    ):
        if got not in allowed:
            raise ArgumentError(f"{what} must be one of {allowed}, got {got!r}")
    clean = tuple(dict.fromkeys(nodes))
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in clean):
        raise ArgumentError(f"numa_nodes must be node numbers >= 0, got {list(nodes)!r}")
    if (policy == "none") != (not clean):
        raise ArgumentError(
            f"numa_policy={policy!r} with numa_nodes={list(clean)}: a policy needs nodes and "
            "nodes need a policy (set both, or neither)"
        )
    return _Request(size, prefault, huge, policy, clean, mode)  # type: ignore[arg-type]


def _map(name: str, req: _Request) -> Region:
    huge = _os.huge_page_size()
    mapped = -(-req.size // huge) * huge
    fd = _memfd(name) if req.shared else -1
    try:
        mm = _mapping(name, mapped, fd)
        if req.huge_pages != "off" and _base(mm) % huge:
            # THP needs huge-page-aligned virtual addresses; over-map one huge page and start
            # the region at the first aligned byte (the slack is never touched, so never backed).
            mm.close()
            mm = _mapping(name, mapped + huge, fd)
            return Region(name, req, mm, -_base(mm) % huge, mapped, fd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    return Region(name, req, mm, 0, mapped, fd)


def _memfd(name: str) -> int:
    """A new memfd for a shared region (its name shows in /proc/PID/maps as ``memfd:NAME``)."""
    try:
        return os.memfd_create(f"kvcr-policy:{name}"[:249], os.MFD_CLOEXEC)
    except (AttributeError, OSError) as err:
        message = f"tier {name!r}: cannot create shared memory (memfd_create: {err})"
        raise CapacityError(message) from None


def _mapping(name: str, size: int, fd: int) -> mmap.mmap:
    """An anonymous private mapping (``fd`` -1), or ``fd`` sized and mapped shared; the kernel's
    refusal (overcommit) as a CapacityError."""
    try:
        if fd < 0:
            return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    except OSError as err:
        message = (
            f"tier {name!r}: the kernel refused to map {size} bytes ({os.strerror(err.errno or 0)}"
            "): lower placement.capacity_bytes (or audit --size) to what this machine can hold"
        )
        raise CapacityError(message) from None


def _base(mm: mmap.mmap) -> int:
    return _os.mapping_address(mm)


def _refuse_or_record(
    region: Region, what: str, asked: str, got: str, fix: str, require: bool
) -> None:
    """`require`: raise, saying asked / obtained / fix; `prefer`: record the fallback."""
    if require:
        raise PlacementError(
            f"tier {region.name!r}: {what} asked for {asked} (mode require), obtained {got}; "
            f"fix: {fix}, or use mode 'prefer' to accept the fallback"
        )
    region._fallbacks.append((what, f"asked for {asked}, obtained {got}"))


def _advise_huge(region: Region) -> None:
    require = region._req.huge_pages == "require"
    fix = f"enable THP: echo madvise > {_os.sys_root()}/kernel/mm/transparent_hugepage/enabled"
    if not _os.has_thp():
        got = f"no huge pages (THP mode is {_os.thp_mode() or 'unavailable'})"
        _refuse_or_record(region, "huge_pages", "transparent huge pages", got, fix, require)
        return
    if region._req.shared and _os.shmem_thp_mode() not in ("advise", "always", "within_size"):
        got = f"no huge pages for shared memory (shmem THP is {_os.shmem_thp_mode() or 'off'})"
        fix = (
            f"echo advise > {_os.sys_root()}/kernel/mm/transparent_hugepage/shmem_enabled, or "
            "use a process-private tier"
        )
        _refuse_or_record(region, "huge_pages", "transparent huge pages", got, fix, require)
        return
    try:
        _os.madvise(region._mm, _os.MADV_HUGEPAGE)
    except OSError as err:
        _refuse_or_record(region, "huge_pages", "MADV_HUGEPAGE", str(err), fix, require)
        return
    region._huge_advised = True


def _apply_numa(region: Region) -> None:
    req = region._req
    require = req.numa_mode == "require"
    online = _os.online_nodes()
    shown = _os.format_node_list(online)
    asked = f"{req.numa_policy} over node(s) {_os.format_node_list(req.numa_nodes)}"
    nodes = [n for n in req.numa_nodes if n in online]
    missing = [n for n in req.numa_nodes if n not in online]
    fix = f"choose numa_nodes from the online nodes {shown}"
    if missing:
        got = f"node(s) {_os.format_node_list(missing)} not online (online nodes: {shown})"
        _refuse_or_record(region, "numa", asked, got, fix, require)
    if not nodes:
        return
    if not _os.has_numa_syscalls():
        got = "no NUMA syscalls (kernel without NUMA, or blocked by seccomp)"
        _refuse_or_record(region, "numa", asked, got, "run where mbind(2) is allowed", require)
        return
    try:
        _os.mbind(_base(region._mm), len(region._mm), _MPOL[req.numa_policy], nodes)
    except OSError as err:
        _refuse_or_record(region, "numa", asked, f"default policy ({err})", fix, require)
        return
    # mbind(2) accepts a mask and silently keeps only the nodes this process may use (its
    # cpuset, nodes with memory); only an empty result is EINVAL. Read back what it kept.
    try:
        kept = _os.get_mempolicy(_base(region._mm))[1]
    except OSError:
        kept = ()
    dropped = [n for n in nodes if kept and n not in kept]
    if dropped:
        got = (
            f"{req.numa_policy} over node(s) {_os.format_node_list(kept)}: the kernel dropped "
            f"node(s) {_os.format_node_list(dropped)} (outside this process's cpuset, or "
            "without memory)"
        )
        _refuse_or_record(region, "numa", asked, got, fix, require)
    region._numa_nodes = tuple(n for n in nodes if n not in dropped)


def _populate(region: Region, start: int, length: int) -> str:
    """Fault ``[start, start+length)`` in, PREFAULT_CHUNK bytes at a time (see there)."""
    stop = start + length
    if _os.has_populate_write():
        try:
            for offset in range(start, stop, PREFAULT_CHUNK):
                count = min(PREFAULT_CHUNK, stop - offset)
                _os.madvise(region._mm, _os.MADV_POPULATE_WRITE, offset, count)
            return "populate_write"
        except OSError as err:
            _LOG.debug("MADV_POPULATE_WRITE failed (%s); touching each page instead", err)
    # One written byte per base page faults it in (a write fault allocates; a read maps the zero
    # page), as fast as numpy can stride; each fault takes the lock on its own.
    view = np.frombuffer(region._mm, dtype=np.uint8, count=length, offset=start)
    view[:: _os.page_size()] = 0
    del view
    return "touch"


def _prefault(region: Region) -> None:
    req = region._req
    if req.prefault:
        region._prefault_method = _populate(region, region._offset, region._mapped)
    elif req.huge_pages == "require" and region._huge_advised:
        _populate(region, region._offset, _os.huge_page_size())  # probe, see module docstring


def _check_obtained(region: Region, audit: PlacementAudit) -> None:
    req = region._req
    checked = req.prefault or req.huge_pages == "require"
    if region._huge_advised and checked and audit.huge_page_bytes == 0:
        got = f"0 bytes of AnonHugePages after pre-fault (THP mode {_os.thp_mode()})"
        fix = "check /sys/kernel/mm/transparent_hugepage/defrag and free memory"
        _refuse_or_record(region, "huge_pages", "huge pages", got, fix, req.huge_pages == "require")
    applied = region._numa_nodes
    stray = [n for n in audit.pages_per_node if isinstance(n, int) and n not in applied]
    if applied and stray:
        asked = f"pages on node(s) {_os.format_node_list(applied)}"
        got = f"sampled pages on node(s) {_os.format_node_list(stray)}"
        fix = "free memory on the requested nodes"
        _refuse_or_record(region, "numa", asked, got, fix, req.numa_mode == "require")


def _audit(region: Region) -> PlacementAudit:
    req, page = region._req, _os.page_size()
    address = _base(region._mm) + region._offset
    huge = _os.smaps_anon_huge_bytes(address, region._mapped)
    total = -(-req.size // page)
    per_node: dict[int | str, int] = {}
    sampled, policy = 0, "unknown"
    nodes: tuple[int, ...] = ()
    if _os.has_numa_syscalls():
        index = np.unique(np.linspace(0, total - 1, num=min(total, NUMA_SAMPLE_PAGES)).astype(int))
        status = _os.move_pages_query(address + index * page)
        sampled = int(index.size)
        for value, count in zip(*np.unique(status, return_counts=True), strict=True):
            key: int | str = int(value) if value >= 0 else _errno_key(-int(value))
            per_node[key] = per_node.get(key, 0) + int(count)
        mode, nodes = _os.get_mempolicy(address)
        policy = _os.MPOL_NAMES.get(mode, str(mode))
    return PlacementAudit(
        name=region._name, bytes=req.size, mapped_bytes=region._mapped, state=region._state,
        leaked=region.leaked, prefaulted=req.prefault, prefault_method=region._prefault_method,
        page_size=page, huge_page_size=_os.huge_page_size(), huge_pages_requested=req.huge_pages,
        huge_page_bytes=huge, huge_pages_obtained=huge > 0, huge_page_ratio=huge / region._mapped,
        numa_policy_requested=req.numa_policy, numa_nodes_requested=req.numa_nodes,
        numa_mode=req.numa_mode, numa_policy_obtained=policy, numa_nodes_obtained=nodes,
        pages_per_node=per_node, numa_sampled_pages=sampled, numa_total_pages=total,
        fallbacks=tuple(region._fallbacks), warnings=tuple(region._warnings), numa_near=req.near,
    )  # fmt: skip


def _errno_key(err: int) -> str:
    return "not_present" if err == errno.ENOENT else errno.errorcode.get(err, f"errno {err}")
