"""How much memory this process can really get, and which limit says so.

:func:`read_headroom` reads every limit that bounds this process's memory, each as a
:class:`Limit` that knows the file it came from and how to raise it:

- the memory cgroup, along the process's cgroup path (each ancestor's limit counts; the
  tightest wins): cgroup v2 ``memory.max`` minus ``memory.current``, cgroup v1
  ``memory.limit_in_bytes`` minus ``memory.usage_in_bytes``. Both usages count page cache,
  which the kernel reclaims before it kills, so the inactive file pages of ``memory.stat``
  (v2 ``inactive_file``, v1 ``total_inactive_file``) are taken off them: the "working set" by
  which the kubelet evicts pods (Kubernetes, "Node-pressure Eviction"; cgroup-v1/memory.rst
  5.5 calls ``usage_in_bytes`` a fuzz value for the same reason);
- the host: ``MemAvailable`` of ``/proc/meminfo`` (proc(5): memory available for new
  allocations without swapping), out of ``MemTotal``;
- the address space: the soft ``RLIMIT_AS`` (``ulimit -v``) less this process's ``VmSize``;
- hugetlbfs's pool, ``HugePages_Free`` x ``Hugepagesize``, only when asked (``hugetlb``): a
  tier's ``huge_pages`` are transparent huge pages (``MADV_HUGEPAGE``), taken from ordinary
  memory, never from that pool (Documentation/admin-guide/mm/hugetlbpage.rst).

The mount points come from ``/proc/self/mountinfo`` (a v1 hierarchy with the ``memory``
controller; the v2 one, which may sit at ``/sys/fs/cgroup/unified`` next to v1 hierarchies);
the path from ``/proc/self/cgroup``, taken relative to the mount's root where a container
mounts its own cgroup as the root. Everything is read through
:func:`~kvcr_policy.memory.linux.proc_root` and :func:`~kvcr_policy.memory.linux.sys_root`, so
tests point it at a written tree. A read opens a dozen small files: 1.1 ms measured on the
2-core machine (1.4 ms inside a limited v1 child cgroup; ``python -m timeit -s "from
kvcr_policy.memory.headroom import read_headroom" "read_headroom()"``), so callers read it
once per tier they open, never per call.

A :class:`Headroom` answers three questions, each with the limit that binds
(:class:`Binding`): what the process may take *now* (a pre-faulted or pinned tier takes all of
its memory at once); what a tier that fills as pages arrive may *grow to* (this process's own
limits as they stand, but the host's whole memory rather than what other processes leave free
this second); and what this *host* can hold at all (every limit's total).
"""

from __future__ import annotations

import re
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .linux import proc_root, sys_root

__all__ = ["Binding", "Headroom", "Limit", "read_headroom"]

# A v1 limit at or above this is "no limit": the kernel reports an unset one as PAGE_COUNTER_MAX
# pages (LONG_MAX rounded down to the page size: 9223372036854771712 on x86_64,
# mm/memcontrol.c); no machine has 2^60 bytes.
_UNLIMITED = 1 << 60
_KB_FIELD = r"^{}:\s+(\d+)\s*kB"
_COUNT_FIELD = r"^{}:\s+(\d+)"
_SCOPES = ("cgroup", "host", "process")
_HOST_FIX = "use a host with more memory, or free memory on this one"


@dataclass(frozen=True, slots=True)
class Limit:
    """One bound on this process's memory, in bytes, with the file it was read from."""

    name: str  # what leaves ``available``: "cgroup v2 memory.max", "MemAvailable", ...
    source: str  # the file (or call) read, for messages
    scope: Literal["cgroup", "host", "process"]  # whom it bounds
    total_name: str  # what ``total`` is: "cgroup v2 memory.max", "MemTotal", ...
    total: int  # the limit itself: memory.max, MemTotal, the soft RLIMIT_AS, the pool
    in_use: int  # what already counts against it
    available: int  # what this process may still take under it now
    #: Other processes move ``available`` at any moment (the host's free memory, a parent
    #: cgroup's siblings): a tier that fills over hours is held to ``total`` there instead.
    shared: bool
    fix: str  # how to raise it, for messages


@dataclass(frozen=True, slots=True)
class Binding:
    """The bytes one question allows and the limit that allows no more."""

    available: int
    limit: Limit


@dataclass(frozen=True, slots=True)
class Headroom:
    """Every limit found (none where nothing could be read: then nothing binds)."""

    limits: tuple[Limit, ...]

    def now(self) -> Binding | None:
        """What this process may take at once (a pre-faulted or pinned tier)."""
        return self._least(lambda limit: limit.available)

    def grow(self) -> Binding | None:
        """What a tier that fills as pages arrive may grow to: this process's own limits as
        they stand, and the total of those other processes share."""
        return self._least(lambda limit: limit.total if limit.shared else limit.available)

    def host(self) -> Binding | None:
        """What this host (or container) holds at all: the least total of the host's memory
        and the cgroup limits, not this process's address space."""
        return self._least(lambda limit: limit.total, ("cgroup", "host"))

    def _least(
        self,
        amount: Callable[[Limit], int],
        scopes: tuple[str, ...] = _SCOPES,
    ) -> Binding | None:
        pairs = [(max(0, amount(limit)), limit) for limit in self.limits if limit.scope in scopes]
        if not pairs:
            return None
        best = min(pairs, key=lambda pair: pair[0])
        return Binding(best[0], best[1])


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _int(path: Path) -> int | None:
    text = (_read(path) or "").strip()
    return int(text) if text.isdigit() else None


def _field(text: str, name: str, pattern: str = r"^{}\s+(\d+)") -> int | None:
    found = re.search(pattern.format(re.escape(name)), text, re.MULTILINE)
    return int(found.group(1)) if found else None


# --- cgroups ------------------------------------------------------------------------------


def _unescape(text: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space; proc(5))."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _under_sys(point: str) -> Path:
    """A mount point, read through :func:`sys_root` where it lies under /sys."""
    if point == "/sys" or point.startswith("/sys/"):
        return sys_root() / point[len("/sys/") :]
    return Path(point)


def _mounts() -> dict[str, tuple[Path, str]]:
    """``{"v1": (mount point, mount root), "v2": ...}`` of the memory cgroup hierarchies.

    mountinfo's fields (proc(5)): id, parent, major:minor, root, mount point, options, optional
    fields, ``-``, file system type, source, super options (a v1 hierarchy's controllers).
    """
    text = _read(proc_root() / "self" / "mountinfo")
    if text is None:  # no mountinfo: the usual places
        return {"v2": (sys_root() / "fs/cgroup", "/"), "v1": (sys_root() / "fs/cgroup/memory", "/")}
    found: dict[str, tuple[Path, str]] = {}
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, kind = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(kind) < 3:
            continue
        mount = (_under_sys(_unescape(fields[4])), _unescape(fields[3]))
        if kind[0] == "cgroup2":
            found.setdefault("v2", mount)
        elif kind[0] == "cgroup" and "memory" in kind[2].split(","):
            found.setdefault("v1", mount)
    return found


def _paths() -> dict[str, str]:
    """This process's cgroup path per hierarchy: ``0::PATH`` is v2, a ``memory`` line is v1."""
    paths: dict[str, str] = {}
    for line in (_read(proc_root() / "self" / "cgroup") or "").splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            paths["v2"] = path
        elif "memory" in controllers.split(","):
            paths["v1"] = path
    return paths


def _levels(point: Path, root: str, path: str) -> list[Path]:
    """The process's cgroup directory and each ancestor up to the mount point, nearest first.

    Where a container mounts its own cgroup as the hierarchy's root, /proc/self/cgroup still
    names it from the host's root: that part is dropped. A path that is not there (another
    cgroup namespace) leaves the mount point alone.
    """
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        path = path[len(root) :]
    parts = [part for part in path.split("/") if part and part != ".."]
    here = point.joinpath(*parts)
    if not here.is_dir():
        return [point]
    return [point.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _cgroup_v2(levels: list[Path]) -> list[Limit]:
    limits = []
    for depth, level in enumerate(levels):
        total = _int(level / "memory.max")  # "max" (no limit) and a missing file give None
        current = _int(level / "memory.current") if total is not None else None
        if total is None or current is None:
            continue
        inactive = _field(_read(level / "memory.stat") or "", "inactive_file") or 0
        limits.append(_cgroup("cgroup v2 memory.max", level / "memory.max", total,
                              current - inactive, depth))  # fmt: skip
    return limits


def _cgroup_v1(levels: list[Path]) -> list[Limit]:
    limits = []
    for depth, level in enumerate(levels):
        if depth and _int(level / "memory.use_hierarchy") == 0:
            break  # its children are not charged to it (cgroup-v1/memory.rst 6)
        total = _int(level / "memory.limit_in_bytes")
        usage = _int(level / "memory.usage_in_bytes")
        if total is None or total >= _UNLIMITED or usage is None:
            continue
        inactive = _field(_read(level / "memory.stat") or "", "total_inactive_file") or 0
        limits.append(_cgroup("cgroup v1 memory.limit_in_bytes", level / "memory.limit_in_bytes",
                              total, usage - inactive, depth))  # fmt: skip
    return limits


def _cgroup(name: str, path: Path, total: int, used: int, depth: int) -> Limit:
    """The limit of one cgroup: its own (depth 0) is this process's; an ancestor's is shared
    with its other children."""
    used = max(0, used)
    fix = f"raise {path.name} of {path.parent} (the container's or pod's memory limit)"
    return Limit(name=name, source=str(path), scope="cgroup", total_name=name, total=total,
                 in_use=used, available=total - used, shared=depth > 0, fix=fix)  # fmt: skip


def _cgroup_limits() -> list[Limit]:
    mounts, paths = _mounts(), _paths()
    limits: list[Limit] = []
    for version, read in (("v2", _cgroup_v2), ("v1", _cgroup_v1)):
        if version in mounts and version in paths:
            point, root = mounts[version]
            limits += read(_levels(point, root, paths[version]))
    return limits


# --- the host and the process -------------------------------------------------------------


def _host_limits(meminfo: str, hugetlb: bool) -> list[Limit]:
    source = str(proc_root() / "meminfo")
    limits = []
    free = _field(meminfo, "MemAvailable", _KB_FIELD)
    total = _field(meminfo, "MemTotal", _KB_FIELD)
    if free is not None and total is not None:
        limits.append(Limit(name="MemAvailable", source=source, scope="host",
                            total_name="MemTotal", total=total << 10,
                            in_use=(total - free) << 10, available=free << 10, shared=True,
                            fix=_HOST_FIX))  # fmt: skip
    if hugetlb:
        size = (_field(meminfo, "Hugepagesize", _KB_FIELD) or 0) << 10
        pages = _field(meminfo, "HugePages_Total", _COUNT_FIELD) or 0
        left = _field(meminfo, "HugePages_Free", _COUNT_FIELD) or 0
        limits.append(Limit(name="HugePages_Free", source=source, scope="host",
                            total_name="HugePages_Total", total=pages * size,
                            in_use=(pages - left) * size, available=left * size, shared=True,
                            fix="reserve more huge pages (sysctl vm.nr_hugepages)"))  # fmt: skip
    return limits


def _address_space() -> list[Limit]:
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return []
    status = _read(proc_root() / "self" / "status") or ""
    size = (_field(status, "VmSize", _KB_FIELD) or 0) << 10
    return [Limit(name="RLIMIT_AS", source="getrlimit(RLIMIT_AS)", scope="process",
                  total_name="RLIMIT_AS", total=soft, in_use=size, available=soft - size,
                  shared=False, fix="raise the address-space limit (ulimit -v)")]  # fmt: skip


def read_headroom(*, hugetlb: bool = False) -> Headroom:
    """Every limit on this process's memory, read now (see the module docstring);
    ``hugetlb``: the tier's pages come from hugetlbfs's pool, so that pool counts too."""
    meminfo = _read(proc_root() / "meminfo") or ""
    return Headroom((*_cgroup_limits(), *_host_limits(meminfo, hugetlb), *_address_space()))
