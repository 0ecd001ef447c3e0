"""Memory limits this machine does not have, written as /proc and /sys trees, and real child
memory cgroups where the kernel lets this process make them.

:class:`FakeHost` writes what :mod:`kvcr_policy.memory.headroom` reads (``meminfo``,
``self/cgroup``, ``self/mountinfo``, the cgroup files of v1 and v2 hierarchies) under a
temporary folder, for ``use_roots(proc=host.proc, sys=host.sys)`` or the
``KVCR_POLICY_PROC_ROOT`` / ``KVCR_POLICY_SYS_ROOT`` variables of a child process. What it does
not fake (``self/maps``, ``self/smaps``, ``self/status``: a pool's buffer check and a region's
audit read them) links to this process's real files.

:func:`child_memory_cgroup` makes a real memory cgroup under this process's own (cgroup v1, as
on this machine; v2 where the memory controller can be delegated to a child) with a limit, and
:func:`in_cgroup` is the command line that runs a program inside it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

__all__ = ["GIB", "MIB", "FakeHost", "child_memory_cgroup", "in_cgroup"]

MIB = 1 << 20
GIB = 1 << 30


class FakeHost:
    """A /proc and /sys tree under ``root``: a host of ``total`` bytes with ``available`` free,
    and no memory cgroup until :meth:`v1` or :meth:`v2` adds one."""

    def __init__(self, root: Path, *, total: int = 32 * GIB, available: int = 16 * GIB) -> None:
        self.proc, self.sys = root / "proc", root / "sys"
        (self.proc / "self").mkdir(parents=True)
        self.sys.mkdir(parents=True)
        for name in ("maps", "smaps", "status"):  # not faked: this process's own
            (self.proc / "self" / name).symlink_to(f"/proc/self/{name}")
        self._cgroups: list[str] = []
        self._mounts: list[str] = []
        self.meminfo(total, available)

    def meminfo(self, total: int, available: int, huge: tuple[int, int, int] | None = None) -> None:
        """``MemTotal``/``MemAvailable``; ``huge``: (HugePages_Total, HugePages_Free, size)."""
        lines = [f"MemTotal: {total >> 10} kB", f"MemAvailable: {available >> 10} kB"]
        if huge is not None:
            pages, free, size = huge
            lines += [f"HugePages_Total: {pages}", f"HugePages_Free: {free}",
                      f"Hugepagesize: {size >> 10} kB"]  # fmt: skip
        (self.proc / "meminfo").write_text("\n".join(lines) + "\n")

    def v2(self, path: str, *, mount: str = "/sys/fs/cgroup", root: str = "/") -> None:
        """This process in cgroup v2 ``path`` of a hierarchy mounted at ``mount``."""
        self._join("0::" + path, f"0:0 {root} {mount} rw - cgroup2 cgroup2 rw")

    def v1(self, path: str, *, mount: str = "/sys/fs/cgroup/memory", root: str = "/") -> None:
        """This process in the v1 ``memory`` hierarchy's cgroup ``path``, mounted at ``mount``."""
        self._join("4:memory:" + path, f"0:0 {root} {mount} rw - cgroup cgroup rw,memory")

    def limit_v2(self, where: str, limit: int | None, current: int, inactive: int = 0) -> Path:
        """cgroup v2 files at ``where`` (a path under /sys): ``memory.max`` (None: "max")."""
        stat = f"anon 1\ninactive_file {inactive}\n"
        shown = "max" if limit is None else str(limit)
        return self._files(where, {"memory.max": shown, "memory.current": str(current),
                                   "memory.stat": stat})  # fmt: skip

    def limit_v1(
        self, where: str, limit: int | None, usage: int, inactive: int = 0, hierarchy: bool = True
    ) -> Path:
        """cgroup v1 files at ``where``: ``memory.limit_in_bytes`` (None: the kernel's
        "unlimited", PAGE_COUNTER_MAX pages of 4 KiB)."""
        shown = str(limit) if limit is not None else str((1 << 63) - 4096)
        return self._files(where, {"memory.limit_in_bytes": shown,
                                   "memory.usage_in_bytes": str(usage),
                                   "memory.use_hierarchy": "1" if hierarchy else "0",
                                   "memory.stat": f"inactive_file 0\ntotal_inactive_file "
                                                  f"{inactive}\n"})  # fmt: skip

    def _join(self, line: str, mount: str) -> None:
        self._cgroups.append(line)
        self._mounts.append(f"{30 + len(self._mounts)} 23 {mount}")
        (self.proc / "self" / "cgroup").write_text("\n".join(self._cgroups) + "\n")
        (self.proc / "self" / "mountinfo").write_text("\n".join(self._mounts) + "\n")

    def _files(self, where: str, files: dict[str, str]) -> Path:
        folder = self.sys / where.removeprefix("/sys/")
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text + "\n")
        return folder


def _own_memory_cgroup() -> tuple[str, Path] | None:
    """("v1" | "v2", this process's memory cgroup folder), from the real /proc."""
    mounts: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        kind = tail.split()
        if len(kind) >= 3 and kind[0] == "cgroup" and "memory" in kind[2].split(","):
            mounts.setdefault("v1", Path(head.split()[4]))
        elif kind and kind[0] == "cgroup2":
            mounts.setdefault("v2", Path(head.split()[4]))
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") and "v1" in mounts:
            return "v1", mounts["v1"] / path.lstrip("/")
    match = re.search(r"^0::(.*)$", Path("/proc/self/cgroup").read_text(), re.MULTILINE)
    if match and "v2" in mounts:
        return "v2", mounts["v2"] / match.group(1).lstrip("/")
    return None


@contextlib.contextmanager
def child_memory_cgroup(limit: int) -> Iterator[Path]:
    """A new memory cgroup under this process's own, limited to ``limit`` bytes; removed after.

    Raises OSError (the caller skips) where the kernel does not let this process make one: no
    memory cgroup, a read-only /sys, no permission, or a v2 parent that cannot delegate the
    memory controller.
    """
    found = _own_memory_cgroup()
    if found is None:
        raise OSError("no memory cgroup (v1 memory hierarchy or v2 with memory) found")
    version, parent = found
    child = parent / f"kvcr-policy-test-{os.getpid()}"
    child.mkdir()
    try:
        if version == "v1":
            (child / "memory.limit_in_bytes").write_text(str(limit))
        else:
            if not (child / "memory.max").exists():
                (parent / "cgroup.subtree_control").write_text("+memory")
            (child / "memory.max").write_text(str(limit))
        yield child
    finally:
        with contextlib.suppress(OSError):  # a process still inside keeps it; never fatal
            child.rmdir()


def in_cgroup(cgroup: Path, *argv: str) -> list[str]:
    """The command line that moves itself into ``cgroup`` and then runs ``argv``."""
    move = f'echo $$ > {shlex.quote(str(cgroup / "cgroup.procs"))} && exec "$@"'
    return ["sh", "-c", move, "sh", *argv]
