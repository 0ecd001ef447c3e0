"""Tests for kvcr_policy.memory.linux: /proc and /sys parsing on fake trees, real syscalls.

The syscalls run for real on the node this process's memory lands on (``tests.support.hosts``),
and a node the kernel does not have is one past the highest online one, so the tests hold on a
host with any number of nodes. Topologies the host lacks (this CI machine has one node) are
faked with a temporary /sys or /proc tree through ``use_roots`` or ``KVCR_POLICY_SYS_ROOT``.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.memory import linux as _os
from tests.support.hosts import absent_node, fake_sys_nodes, home_node, real_nodes
from tests.support.waiting import wait_until

MIB = 1 << 20
needs_numa = pytest.mark.skipif(not _os.has_numa_syscalls(), reason="NUMA syscalls unavailable")


def _address(mm: mmap.mmap) -> int:
    return _os.mapping_address(mm)


@pytest.fixture
def mapping() -> Iterator[mmap.mmap]:
    mm = mmap.mmap(-1, 4 * MIB)
    yield mm
    mm.close()


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# --- node lists and fake /sys ---------------------------------------------------------------


@given(st.sets(st.integers(min_value=0, max_value=200), max_size=30))
def test_node_list_round_trips(nodes: set[int]) -> None:
    assert _os.parse_node_list(_os.format_node_list(sorted(nodes))) == tuple(sorted(nodes))


def test_parse_node_list_kernel_format() -> None:
    assert _os.parse_node_list("0-3,5,7-8\n") == (0, 1, 2, 3, 5, 7, 8)
    assert _os.parse_node_list("\n") == ()


def test_online_nodes_from_fake_sys(tmp_path: Path) -> None:
    """Faked: /sys says nodes 0-3 are online (this machine has only node 0)."""
    _write(tmp_path, "devices/system/node/online", "0-3\n")
    with _os.use_roots(sys=tmp_path):
        assert _os.online_nodes() == (0, 1, 2, 3)
    assert _os.online_nodes() == real_nodes()  # the real tree again


def test_online_nodes_falls_back_to_node_dirs_then_node_0(tmp_path: Path) -> None:
    for name in ("node0", "node2", "nodes", "power"):
        (tmp_path / "devices/system/node" / name).mkdir(parents=True)
    with _os.use_roots(sys=tmp_path):
        assert _os.online_nodes() == (0, 2)
    with _os.use_roots(sys=tmp_path / "empty"):
        assert _os.online_nodes() == (0,)


def test_env_var_roots_and_cache_clearing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Faked: a two-node /sys through KVCR_POLICY_SYS_ROOT (this CI host has one node)."""
    fake_sys_nodes(tmp_path, (0, 1))
    monkeypatch.setenv(_os.SYS_ROOT_ENV, str(tmp_path))
    _os.clear_caches()
    try:
        assert _os.sys_root() == tmp_path
        assert _os.online_nodes() == (0, 1)
    finally:
        monkeypatch.delenv(_os.SYS_ROOT_ENV)
        _os.clear_caches()
    assert _os.sys_root() == Path("/sys")


@pytest.mark.parametrize(
    ("text", "mode", "has"),
    [
        ("always [madvise] never\n", "madvise", True),
        ("[always] madvise never\n", "always", True),
        ("always madvise [never]\n", "never", False),
        (None, None, False),
    ],
)
def test_thp_mode_from_fake_sys(tmp_path: Path, text: str | None, mode: str | None, has: bool):
    if text is not None:
        _write(tmp_path, "kernel/mm/transparent_hugepage/enabled", text)
    with _os.use_roots(sys=tmp_path):
        assert _os.thp_mode() == mode
        assert _os.has_thp() is has


def test_huge_page_size_from_pmd_size_then_meminfo(tmp_path: Path) -> None:
    """Faked: a 1 GiB hugetlbfs default (meminfo) next to 512 KiB THP pages (sys)."""
    _write(tmp_path / "proc", "meminfo", "MemTotal: 100 kB\nHugepagesize:    1048576 kB\n")
    _write(tmp_path / "sys", "kernel/mm/transparent_hugepage/hpage_pmd_size", "524288\n")
    with _os.use_roots(proc=tmp_path / "proc", sys=tmp_path / "sys"):
        assert _os.huge_page_size() == 512 * 1024
    with _os.use_roots(proc=tmp_path / "proc", sys=tmp_path / "empty"):
        assert _os.huge_page_size() == 1 << 30
    with _os.use_roots(proc=tmp_path / "empty", sys=tmp_path / "empty"):
        assert _os.huge_page_size() == 2 * MIB


# --- smaps ------------------------------------------------------------------------------------

FAKE_SMAPS = """\
00400000-00600000 r-xp 00000000 08:01 123   /usr/bin/with spaces in path
Size:               2048 kB
AnonHugePages:         0 kB
VmFlags: rd ex mr mw me
7f0000000000-7f0000800000 rw-p 00000000 00:00 0
Size:               8192 kB
AnonHugePages:      6144 kB
THPeligible:    1
this line is garbage
ProtectionKey:         0
VmFlags: rd wr mr mw me dc ac hg
7f0000800000-7f0000a00000 rw-p 00000000 00:00 0 [heap]
AnonHugePages:      2048 kB
VmFlags: rd wr mr mw me ac
"""


def test_smaps_parsing_is_robust(tmp_path: Path) -> None:
    """Faked: a hand-written /proc/self/smaps with odd lines, so totals are known exactly."""
    _write(tmp_path, "self/smaps", FAKE_SMAPS)
    with _os.use_roots(proc=tmp_path):
        entries = _os.smaps_entries()
        assert [(e.start, e.end) for e in entries] == [
            (0x400000, 0x600000),
            (0x7F0000000000, 0x7F0000800000),
            (0x7F0000800000, 0x7F0000A00000),
        ]
        assert entries[1].fields["AnonHugePages"] == 6 * MIB
        assert entries[1].fields["THPeligible"] == 1
        assert "dc" in entries[1].vm_flags
        base = 0x7F0000000000
        assert _os.smaps_anon_huge_bytes(base, 10 * MIB) == 8 * MIB
        # Capped at the overlap: 1 MiB of the first mapping can hold at most 1 MiB.
        assert _os.smaps_anon_huge_bytes(base, 1 * MIB) == 1 * MIB
        assert _os.smaps_anon_huge_bytes(0x1000, 0x1000) == 0
        assert _os.smaps_vm_flags(base, 8 * MIB) >= {"dc", "hg"}
        assert "dc" not in _os.smaps_vm_flags(base, 10 * MIB)  # the heap lacks it
        assert _os.smaps_vm_flags(0x1000, 0x1000) == frozenset()


def test_missing_smaps_is_an_os_call_error(tmp_path: Path) -> None:
    with _os.use_roots(proc=tmp_path), pytest.raises(_os.OsCallError) as info:
        _os.smaps_entries()
    assert info.value.errno == errno.ENOENT
    assert "smaps" in str(info.value)


# --- real syscalls on node 0 -----------------------------------------------------------------


def test_madvise_dontfork_shows_in_real_smaps(mapping: mmap.mmap) -> None:
    _os.madvise(mapping, _os.MADV_DONTFORK)
    # proc(5): "dc" = do not copy area on fork (VM_DONTCOPY); "dd" would be "do not dump".
    assert "dc" in _os.smaps_vm_flags(_address(mapping), len(mapping))


def test_madvise_error_is_translated(mapping: mmap.mmap) -> None:
    with pytest.raises(_os.OsCallError) as info:
        _os.madvise(mapping, 12345)  # no such advice
    assert info.value.errno == errno.EINVAL
    assert info.value.call == "madvise(12345)"
    assert "EINVAL" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)


# The blocking syscalls a poll(2) from C may enter: x86_64's poll and ppoll
# (arch/x86/entry/syscalls/syscall_64.tbl), the generic ppoll (include/uapi/asm-generic/unistd.h).
_POLL_SYSCALLS = {"x86_64": {7, 271}, "aarch64": {73}}


def _in_syscall(tid: int, numbers: set[int]) -> bool:
    """Whether thread ``tid`` of this process is blocked in one of the syscalls ``numbers``
    (the first field of /proc/self/task/TID/syscall, proc(5))."""
    fields = (Path("/proc/self/task") / str(tid) / "syscall").read_text().split()
    return bool(fields) and fields[0].isdigit() and int(fields[0]) in numbers


def test_madvise_lets_other_threads_run_while_the_kernel_works(
    mapping: mmap.mmap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pre-faulting a tier takes seconds per GiB on a busy host; a peer's UCX worker thread must
    answer heartbeats meanwhile, so madvise(2) may not hold the GIL (``mmap.madvise`` does).

    The kernel's side is replaced by a call of the same C shape (pointer, count, int) that blocks
    until another Python thread acts: poll(2) of one pollfd for a pipe, with a long timeout. This
    thread writes to the pipe only once it sees the caller blocked inside poll; were the GIL held
    through the call, this thread could not run until poll timed out, and the test fails."""
    machine = platform.machine().lower()
    numbers = _POLL_SYSCALLS.get({"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine))
    if numbers is None:
        pytest.skip(f"no poll syscall numbers known for {machine}")
    libc = ctypes.CDLL(None, use_errno=True)
    stand_in = libc.poll
    stand_in.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    stand_in.restype = ctypes.c_int
    monkeypatch.setattr(_os, "_libc", lambda: SimpleNamespace(madvise=stand_in))
    read_end, write_end = os.pipe()
    pollin, timeout_ms = 1, 600_000
    mapping[0:8] = struct.pack("ihh", read_end, pollin, 0)  # struct pollfd {fd, events, revents}
    tid: list[int] = []
    thread = threading.Thread(
        target=lambda: (
            tid.append(threading.get_native_id()),
            _os.madvise(mapping, timeout_ms, 0, 1),
        )
    )
    try:
        thread.start()
        wait_until(lambda: tid and _in_syscall(tid[0], numbers), "the caller inside poll(2)", 60)
        os.write(write_end, b"x")
        thread.join(60)
        assert not thread.is_alive()
        assert struct.unpack("ihh", mapping[0:8])[2] & pollin  # woken by the write, not a timeout
    finally:
        os.write(write_end, b"x")
        thread.join()
        os.close(read_end)
        os.close(write_end)


@needs_numa
def test_populate_write_faults_pages_in(mapping: mmap.mmap) -> None:
    if not _os.has_populate_write():
        pytest.skip("kernel older than 5.14: no MADV_POPULATE_WRITE")
    base, page = _address(mapping), _os.page_size()
    assert (_os.move_pages_query([base]) == -errno.ENOENT).all()
    _os.madvise(mapping, _os.MADV_POPULATE_WRITE, 0, MIB)
    status = _os.move_pages_query(base + np.arange(0, MIB, page))
    assert (status >= 0).all()


@needs_numa
def test_mbind_home_node_then_move_pages_reports_it(mapping: mmap.mmap) -> None:
    base, page, node = _address(mapping), _os.page_size(), home_node()
    _os.mbind(base, len(mapping), _os.MPOL_BIND, [node])
    assert _os.get_mempolicy(base) == (_os.MPOL_BIND, (node,))
    # Touch the first MiB; the last MiB stays untouched even if THP rounds faults to 2 MiB
    # (a huge page containing offset < 1 MiB ends before offset 3 MiB).
    view = np.frombuffer(mapping, dtype=np.uint8)
    view[:MIB] = 7
    del view
    touched = _os.move_pages_query(base + np.arange(0, MIB, page))
    untouched = _os.move_pages_query(base + np.arange(3 * MIB, 4 * MIB, page))
    assert set(touched.tolist()) == {node}
    assert set(untouched.tolist()) == {-errno.ENOENT}


@needs_numa
def test_mbind_on_an_absent_node_fails_with_einval(mapping: mmap.mmap) -> None:
    """One past the highest online node does not exist, so the kernel refuses it."""
    node = absent_node()
    with pytest.raises(_os.OsCallError) as info:
        _os.mbind(_address(mapping), len(mapping), _os.MPOL_BIND, [node])
    assert info.value.call == "mbind"
    assert info.value.errno in (errno.EINVAL, errno.ENODEV)
    assert f"nodes [{node}]" in str(info.value)


@needs_numa
def test_thread_policy_reads_back() -> None:
    mode, nodes = _os.get_mempolicy()
    assert mode in _os.MPOL_NAMES and all(node >= 0 for node in nodes)


def test_move_pages_query_of_nothing() -> None:
    assert _os.move_pages_query([]).shape == (0,)
