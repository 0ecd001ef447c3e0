"""The one thin OS layer: memory-placement syscalls, capability flags, ``/proc`` and ``/sys``.

Everything in kvcr_policy that talks to the Linux kernel about memory goes through this module,
so the rest of the package deals in plain values and one error type (modelled on psutil's
``_pslinux``):

- ``proc_root()`` / ``sys_root()``: where ``/proc`` and ``/sys`` are read from. Tests point them
  at a temporary tree with ``use_roots(proc=..., sys=...)`` or the ``KVCR_POLICY_PROC_ROOT`` /
  ``KVCR_POLICY_SYS_ROOT`` environment variables, to fake a multi-node topology.
- Capability flags, computed once (``functools.cache``) and cleared by ``use_roots`` and
  ``clear_caches``: ``page_size``, ``huge_page_size``, ``thp_mode``, ``has_thp``,
  ``has_populate_write``, ``has_numa_syscalls``, ``online_nodes``.
- Syscalls through ctypes, which releases the GIL while the kernel works: ``mbind``,
  ``get_mempolicy``, ``move_pages_query``, ``madvise``.
- ``/proc/self/smaps``: ``smaps_entries``, ``smaps_anon_huge_bytes``, ``smaps_vm_flags``;
  ``/proc/self/maps``: ``writable_range`` (may the process write every byte of a range).
- ``limit_heap_retention``: glibc's ``mallopt`` so that freed large buffers leave the process.

What this process may still allocate (cgroups, ``MemAvailable``, ``RLIMIT_AS``) is
:mod:`.headroom`'s.

OS failures are translated once, here, into :class:`OsCallError` (an ``OSError`` carrying the
call name and errno), raised ``from`` the original error where there is one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import mmap
import os
import platform
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from kvcr_policy.errors import ArgumentError, OsCallError

__all__ = [
    "MADV_DONTFORK", "MADV_HUGEPAGE", "MADV_POPULATE_WRITE", "MPOL_BIND", "MPOL_DEFAULT",
    "MPOL_INTERLEAVE", "MPOL_NAMES", "MPOL_PREFERRED", "PROC_ROOT_ENV", "SYS_ROOT_ENV",
    "OsCallError", "SmapsEntry", "clear_caches", "format_node_list", "get_mempolicy",
    "has_numa_syscalls", "has_populate_write", "has_thp", "huge_page_size",
    "limit_heap_retention", "madvise", "mapping_address", "mbind", "move_pages_query",
    "online_nodes", "page_size", "parse_node_list", "pci_numa_node", "proc_root",
    "shmem_thp_mode", "smaps_anon_huge_bytes", "smaps_entries", "smaps_vm_flags", "sys_root",
    "thp_mode",
    "use_roots", "writable_range",
]  # fmt: skip

PROC_ROOT_ENV = "KVCR_POLICY_PROC_ROOT"
SYS_ROOT_ENV = "KVCR_POLICY_SYS_ROOT"

# Memory policy modes: include/uapi/linux/mempolicy.h (the anonymous enum), set_mempolicy(2).
MPOL_DEFAULT = 0
MPOL_PREFERRED = 1
MPOL_BIND = 2
MPOL_INTERLEAVE = 3
MPOL_NAMES: Mapping[int, str] = {0: "default", 1: "preferred", 2: "bind", 3: "interleave"}
# Mode flags the kernel may OR into the mode get_mempolicy returns, same header:
# MPOL_F_STATIC_NODES (1 << 15), MPOL_F_RELATIVE_NODES (1 << 14), MPOL_F_NUMA_BALANCING (1 << 13).
_MPOL_MODE_FLAGS = (1 << 15) | (1 << 14) | (1 << 13)
# get_mempolicy(2) flag: report the policy of the mapping that contains ``addr``; same header.
_MPOL_F_ADDR = 1 << 1

# madvise(2) advice values: include/uapi/asm-generic/mman-common.h.
MADV_DONTFORK = 10
MADV_HUGEPAGE = 14
MADV_POPULATE_WRITE = 23  # Linux 5.14+; older kernels answer EINVAL (madvise(2)).
_ADVICE_NAMES = {10: "MADV_DONTFORK", 14: "MADV_HUGEPAGE", 23: "MADV_POPULATE_WRITE"}

# Syscall numbers. x86_64: arch/x86/entry/syscalls/syscall_64.tbl; aarch64 uses the generic
# table, include/uapi/asm-generic/unistd.h (__NR_mbind 235, __NR_get_mempolicy 236,
# __NR_move_pages 239).
_SYSCALLS: Mapping[str, Mapping[str, int]] = {
    "x86_64": {"mbind": 237, "get_mempolicy": 239, "move_pages": 279},
    "aarch64": {"mbind": 235, "get_mempolicy": 236, "move_pages": 239},
}
_MACHINE_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}

# Bits in the node mask handed to get_mempolicy: it must cover nr_node_ids or the kernel answers
# EINVAL (mm/mempolicy.c, kernel_get_mempolicy); 1024 is the largest MAX_NUMNODES that distro
# kernels build with (CONFIG_NODES_SHIFT=10, mm/Kconfig).
_NODEMASK_BITS = 1024
_ULONG_BITS = ctypes.sizeof(ctypes.c_ulong) * 8
# Used when neither /sys nor /proc/meminfo says: the PMD size with 4 KiB base pages on x86_64 and
# aarch64 (Documentation/admin-guide/mm/transhuge.rst).
_DEFAULT_HUGE_PAGE = 2 << 20

_roots: dict[str, Path] = {}


# --- roots ------------------------------------------------------------------------------------


def proc_root() -> Path:
    """Where ``/proc`` is read from: ``use_roots``, then ``$KVCR_POLICY_PROC_ROOT``, then /proc."""
    return _roots.get("proc") or Path(os.environ.get(PROC_ROOT_ENV) or "/proc")


def sys_root() -> Path:
    """Where ``/sys`` is read from: ``use_roots``, then ``$KVCR_POLICY_SYS_ROOT``, then /sys."""
    return _roots.get("sys") or Path(os.environ.get(SYS_ROOT_ENV) or "/sys")


@contextlib.contextmanager
def use_roots(
    *, proc: str | os.PathLike[str] | None = None, sys: str | os.PathLike[str] | None = None
) -> Iterator[None]:
    """Read ``/proc`` and/or ``/sys`` from other trees inside the block (capabilities recomputed).

    Only the file-derived facts follow the roots; syscalls and probes still hit the real kernel.
    """
    saved = dict(_roots)
    if proc is not None:
        _roots["proc"] = Path(proc)
    if sys is not None:
        _roots["sys"] = Path(sys)
    clear_caches()
    try:
        yield
    finally:
        _roots.clear()
        _roots.update(saved)
        clear_caches()


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


# --- node lists ---------------------------------------------------------------------------------


def parse_node_list(text: str) -> tuple[int, ...]:
    """Parse the kernel's list format (``"0-3,5"``, Documentation/admin-guide/cputopology.rst)."""
    nodes: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        low, sep, high = part.partition("-")
        if sep:
            nodes.update(range(int(low), int(high) + 1))
        else:
            nodes.add(int(low))
    return tuple(sorted(nodes))


def format_node_list(nodes: Sequence[int]) -> str:
    """Render nodes in the kernel's list format, the inverse of :func:`parse_node_list`."""
    runs: list[str] = []
    for node in sorted(set(nodes)):
        if runs and runs[-1].rpartition("-")[2] == str(node - 1):
            runs[-1] = f"{runs[-1].partition('-')[0]}-{node}"
        else:
            runs.append(str(node))
    return ",".join(runs)


# --- capabilities -------------------------------------------------------------------------------


@functools.cache
def page_size() -> int:
    """The base page size in bytes."""
    return mmap.PAGESIZE


@functools.cache
def huge_page_size() -> int:
    """The huge page size: THP's ``hpage_pmd_size``, else meminfo ``Hugepagesize``, else 2 MiB.

    THP's size comes first: meminfo's is the hugetlbfs default, which a boot option can make
    1 GiB while transparent huge pages stay at the PMD size (transhuge.rst).
    """
    pmd = (_read_text(sys_root() / "kernel/mm/transparent_hugepage/hpage_pmd_size") or "").strip()
    if pmd.isdigit():
        return int(pmd)
    meminfo = _read_text(proc_root() / "meminfo") or ""
    match = re.search(r"^Hugepagesize:\s+(\d+)\s*kB", meminfo, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else _DEFAULT_HUGE_PAGE


@functools.cache
def thp_mode() -> str | None:
    """The bracketed transparent huge page mode (always, madvise, never), None without THP."""
    text = _read_text(sys_root() / "kernel/mm/transparent_hugepage/enabled")
    match = re.search(r"\[(\w+)\]", text or "")
    return match.group(1) if match else None


def shmem_thp_mode() -> str | None:
    """The bracketed shmem THP mode (always, within_size, advise, never, deny, force), None
    without it: whether a shared region (memfd) can get huge pages."""
    text = _read_text(sys_root() / "kernel/mm/transparent_hugepage/shmem_enabled")
    match = re.search(r"\[(\w+)\]", text or "")
    return match.group(1) if match else None


def has_thp() -> bool:
    """Whether ``MADV_HUGEPAGE`` can give huge pages: THP mode ``always`` or ``madvise``."""
    return thp_mode() in ("always", "madvise")


@functools.cache
def has_populate_write() -> bool:
    """Whether the kernel knows ``MADV_POPULATE_WRITE`` (probed once on a one-page mapping)."""
    probe = mmap.mmap(-1, page_size())
    try:
        probe.madvise(MADV_POPULATE_WRITE)
    except (OSError, ValueError):
        return False
    finally:
        probe.close()
    return True


@functools.cache
def has_numa_syscalls() -> bool:
    """Whether get_mempolicy works here (absent arch, ENOSYS or a seccomp EPERM say no)."""
    try:
        get_mempolicy()
    except OSError:
        return False
    return True


@functools.cache
def online_nodes() -> tuple[int, ...]:
    """Online NUMA nodes: ``devices/system/node/online``, else ``nodeN`` dirs, else ``(0,)``.

    A kernel without NUMA support still has node 0, so that is the answer when /sys says nothing.
    """
    node_dir = sys_root() / "devices/system/node"
    text = _read_text(node_dir / "online")
    if text is not None and text.strip():
        return parse_node_list(text)
    try:
        names = [p.name for p in node_dir.iterdir() if re.fullmatch(r"node\d+", p.name)]
    except OSError:
        names = []
    return tuple(sorted(int(n[4:]) for n in names)) or (0,)


def pci_numa_node(address: str) -> int | None:
    """The ``numa_node`` of PCI device ``address`` (``"0000:3b:00.0"``), None when unreadable.

    ``bus/pci/devices/<address>/numa_node`` holds the node the device is attached to, or -1
    where the platform reports none (single-node hosts, most VMs), which is returned as is
    (Documentation/ABI/testing/sysfs-bus-pci, ``numa_node``).
    """
    text = _read_text(sys_root() / "bus/pci/devices" / address / "numa_node")
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def clear_caches() -> None:
    """Forget every computed capability (after the roots or the environment changed)."""
    for cached in (page_size, huge_page_size, thp_mode, has_populate_write, has_numa_syscalls):
        cached.cache_clear()
    online_nodes.cache_clear()


# --- syscalls -----------------------------------------------------------------------------------


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.madvise.restype = ctypes.c_int
    return libc


def _syscall(name: str, *args: object, detail: str = "") -> int:
    machine = platform.machine().lower()
    number = _SYSCALLS.get(_MACHINE_ALIASES.get(machine, machine), {}).get(name)
    if number is None:
        raise OsCallError(name, errno.ENOSYS, f"no syscall number known for {machine}")
    # Every argument is an explicit ctypes value: syscall(2) is variadic and reads longs.
    result = int(_libc().syscall(ctypes.c_long(number), *args))
    if result == -1:
        raise OsCallError(name, ctypes.get_errno(), detail)
    return result


def _nodemask(nodes: Sequence[int], bits: int) -> ctypes.Array[ctypes.c_ulong]:
    mask = (ctypes.c_ulong * max(1, -(-bits // _ULONG_BITS)))()
    for node in nodes:
        mask[node // _ULONG_BITS] |= 1 << (node % _ULONG_BITS)
    return mask


def mbind(address: int, length: int, mode: int, nodes: Sequence[int], flags: int = 0) -> None:
    """Set the NUMA policy ``mode`` (``MPOL_*``) over ``nodes`` for ``[address, +length)``.

    ``MPOL_PREFERRED`` uses only the first node of the mask (mm/mempolicy.c).
    """
    if any(node < 0 for node in nodes):
        raise ArgumentError(f"NUMA node numbers are >= 0, got {list(nodes)}")
    if mode == MPOL_DEFAULT or not nodes:
        mask, maxnode = None, 0
    else:
        mask = _nodemask(nodes, max(nodes) + 1)
        # The kernel reads maxnode - 1 bits (mm/mempolicy.c get_nodes), as libnuma knows.
        maxnode = len(mask) * _ULONG_BITS + 1
    _syscall(
        "mbind",
        ctypes.c_void_p(address),
        ctypes.c_ulong(length),
        ctypes.c_long(mode),
        mask,
        ctypes.c_ulong(maxnode),
        ctypes.c_ulong(flags),
        detail=f"{MPOL_NAMES.get(mode, mode)} over nodes {list(nodes)} at {address:#x}+{length}",
    )


def get_mempolicy(address: int | None = None) -> tuple[int, tuple[int, ...]]:
    """The policy (mode, nodes) of the mapping at ``address``, or of the thread when None."""
    mode = ctypes.c_int(0)
    mask = _nodemask((), _NODEMASK_BITS)
    _syscall(
        "get_mempolicy",
        ctypes.byref(mode),
        mask,
        ctypes.c_ulong(_NODEMASK_BITS + 1),
        ctypes.c_void_p(address or 0),
        ctypes.c_ulong(_MPOL_F_ADDR if address is not None else 0),
    )
    nodes = tuple(
        word * _ULONG_BITS + bit
        for word, value in enumerate(mask)
        for bit in range(_ULONG_BITS)
        if value >> bit & 1
    )
    return mode.value & ~_MPOL_MODE_FLAGS, nodes


def move_pages_query(addresses: Sequence[int] | npt.NDArray[np.integer]) -> npt.NDArray[np.int32]:
    """The node of each page (move_pages(2) with nodes=NULL); a negative entry is -errno.

    ``-ENOENT``: the page is not present (never touched); ``-EFAULT``: the zero page or no mapping.
    """
    pages = np.ascontiguousarray(addresses, dtype=np.uintp)
    status = np.full(pages.shape, -errno.EINVAL, dtype=np.int32)
    if pages.size:
        _syscall(
            "move_pages",
            ctypes.c_long(0),  # pid 0: this process
            ctypes.c_ulong(pages.size),
            ctypes.c_void_p(pages.ctypes.data),
            None,  # nodes=NULL: query, move nothing
            ctypes.c_void_p(status.ctypes.data),
            ctypes.c_long(0),
        )
    return status


def mapping_address(mm: mmap.mmap) -> int:
    """The address of the first byte of ``mm`` (its buffer export is released at once)."""
    anchor = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(anchor)
    finally:
        del anchor


def madvise(mm: mmap.mmap, advice: int, start: int = 0, length: int | None = None) -> None:
    """madvise(2) over ``[start, start+length)`` of ``mm`` (the rest of it when length is None).

    Called through ctypes, which releases the GIL for the call: ``mmap.madvise`` holds it, and
    ``MADV_POPULATE_WRITE`` of a tier takes seconds per GiB on a busy host, during which no other
    thread of the process (a peer's UCX worker answering heartbeats) could run.
    """
    name = _ADVICE_NAMES.get(advice, str(advice))
    size = len(mm)
    if length is None:
        length = size - start
    if not (0 <= start <= size and 0 <= length <= size - start):
        raise ArgumentError(f"madvise({name}): [{start}, {start}+{length}) is outside {size} bytes")
    result = int(_libc().madvise(mapping_address(mm) + start, length, advice))
    if result == -1:
        code = ctypes.get_errno() or errno.EINVAL
        raise OsCallError(f"madvise({name})", code) from OSError(code, os.strerror(code))


# --- smaps --------------------------------------------------------------------------------------

# "start-end perms offset dev inode [path]" (proc(5), /proc/pid/maps).
_SMAPS_HEADER = re.compile(r"^([0-9a-fA-F]+)-([0-9a-fA-F]+)\s+\S+")
_SMAPS_FIELD = re.compile(r"^([A-Za-z_][\w]*):\s+(\d+)(?:\s+(kB))?\s*$")


@dataclass(frozen=True, slots=True)
class SmapsEntry:
    """One mapping of /proc/PID/smaps: its range, its sizes in bytes, and its VmFlags."""

    start: int
    end: int
    fields: Mapping[str, int]
    vm_flags: frozenset[str]


def smaps_entries(pid: str = "self") -> list[SmapsEntry]:
    """Parse /proc/PID/smaps; lines that match no known shape are skipped, not fatal."""
    path = proc_root() / pid / "smaps"
    try:
        text = path.read_text()
    except OSError as err:
        raise OsCallError(f"read {path}", err.errno or errno.EIO) from err
    entries: list[SmapsEntry] = []
    current: tuple[int, int] | None = None
    fields: dict[str, int] = {}
    flags: frozenset[str] = frozenset()
    for line in [*text.splitlines(), "0-0 ---- end"]:
        header = _SMAPS_HEADER.match(line)
        if header:
            if current is not None:
                entries.append(SmapsEntry(current[0], current[1], dict(fields), flags))
            current = (int(header.group(1), 16), int(header.group(2), 16))
            fields, flags = {}, frozenset()
        elif line.startswith("VmFlags:"):
            flags = frozenset(line.split(":", 1)[1].split())
        elif (field := _SMAPS_FIELD.match(line)) is not None:
            scale = 1024 if field.group(3) else 1
            fields[field.group(1)] = int(field.group(2)) * scale
    return entries


def _overlapping(address: int, length: int) -> Iterator[tuple[SmapsEntry, int]]:
    end = address + length
    for entry in smaps_entries():
        overlap = min(end, entry.end) - max(address, entry.start)
        if overlap > 0:
            yield entry, overlap


def smaps_anon_huge_bytes(address: int, length: int) -> int:
    """Bytes of huge pages (AnonHugePages; ShmemPmdMapped for a shared region) in the mappings
    overlapping ``[address, +length)``.

    smaps reports per mapping, not per range; a mapping that the kernel merged with a neighbour
    may count more, so each mapping's share is capped at its overlap with the range.
    """
    return sum(
        min(e.fields.get("AnonHugePages", 0) + e.fields.get("ShmemPmdMapped", 0), o)
        for e, o in _overlapping(address, length)
    )


def smaps_vm_flags(address: int, length: int) -> frozenset[str]:
    """VmFlags shared by the whole range (proc(5): ``dc`` = MADV_DONTFORK, ``hg`` = HUGEPAGE)."""
    sets = [entry.vm_flags for entry, _ in _overlapping(address, length)]
    return frozenset.intersection(*sets) if sets else frozenset()


# "start-end perms ..." (proc(5), /proc/pid/maps): perms is "rwxp" with "-" for a missing right.
_MAPS_LINE = re.compile(r"^([0-9a-fA-F]+)-([0-9a-fA-F]+)\s+([rwxps-]{4})")


def writable_range(address: int, length: int) -> bool:
    """Whether every byte of ``[address, +length)`` lies in mappings this process may write.

    A read-only file mapping (``np.memmap(mode="r")``) or memory unmapped since would make a
    copy into it kill the process with SIGSEGV; the caller refuses such a buffer instead.
    """
    path = proc_root() / "self" / "maps"
    try:
        text = path.read_text()
    except OSError as err:
        raise OsCallError(f"read {path}", err.errno or errno.EIO) from err
    position, end = address, address + length
    for line in text.splitlines():
        match = _MAPS_LINE.match(line)
        if match is None:
            continue
        start, stop = int(match.group(1), 16), int(match.group(2), 16)
        if stop <= position or start > position:
            continue  # maps is sorted by address: a gap before ``position`` fails below
        if "w" not in match.group(3):
            return False
        position = stop
        if position >= end:
            return True
    return position >= end


# mallopt(3) parameters: malloc/malloc.h of glibc.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def limit_heap_retention(threshold: int) -> bool:
    """Map allocations of ``threshold`` bytes and more on their own (returned to the OS when
    freed) and trim the heap above twice that; False where glibc's mallopt is missing.

    Setting M_MMAP_THRESHOLD turns off glibc's dynamic threshold, which otherwise rises to the
    size of each large block freed (up to 32 MiB, mallopt(3)), so that buffers of a few MiB
    come from the heap afterwards and stay resident once freed.
    """
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_THRESHOLD, threshold) == 1
    return ok and mallopt(_M_TRIM_THRESHOLD, 2 * threshold) == 1
