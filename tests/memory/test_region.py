"""Tests for the DRAM tier region: regions, placement audit, prefer/require, close and leaks.

Real syscalls run on the node this process's memory lands on; a node the kernel lacks is one
past the highest online node (``tests.support.hosts``), so the tests hold on hosts with any
number of nodes. Topologies and kernels this host lacks (the CI machine has one NUMA node and
THP in ``madvise`` mode) are faked with temporary /sys trees through ``_os.use_roots``; the
kernel still knows only its real nodes, which is what makes the "validated but refused by mbind"
path testable.
"""

from __future__ import annotations

import errno
import faulthandler
import json
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy.errors import CapacityError, ClosedError, PlacementError
from kvcr_policy.memory import linux as _os
from kvcr_policy.memory import region as tier
from kvcr_policy.memory.audit_text import format_audit
from kvcr_policy.memory.region import PlacementAudit, Region, open_region
from tests.support.hosts import absent_node, fake_sys_nodes, home_node, real_nodes

MIB = 1 << 20
LOGGER = "kvcr_policy.memory.region"
needs_numa = pytest.mark.skipif(not _os.has_numa_syscalls(), reason="NUMA syscalls unavailable")
needs_thp = pytest.mark.skipif(
    not _os.has_thp(), reason=f"THP mode is {_os.thp_mode()}, huge pages cannot be had"
)


@pytest.fixture
def one_more_node(tmp_path: Path) -> Iterator[int]:
    """Faked: /sys lists the real nodes and one more, which the kernel does not have."""
    extra = absent_node()
    with _os.use_roots(sys=fake_sys_nodes(tmp_path, (*real_nodes(), extra))):
        yield extra


@pytest.fixture
def no_thp(tmp_path: Path) -> Iterator[None]:
    """Faked: THP switched off, which this machine's real /sys does not allow us to do."""
    path = tmp_path / "kernel/mm/transparent_hugepage/enabled"
    path.parent.mkdir(parents=True)
    path.write_text("always madvise [never]\n")
    with _os.use_roots(sys=tmp_path):
        yield


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


# --- opening and using ------------------------------------------------------------------------


def test_region_is_writable_and_readable() -> None:
    with open_region(3 * MIB + 5, name="kv") as region:
        assert (region.name, region.size, region.state) == ("kv", 3 * MIB + 5, "open")
        array = region.array
        assert array.dtype == np.uint8 and array.shape == (3 * MIB + 5,)
        assert region.address == array.ctypes.data
        array[:] = 0xAB
        assert int(array[-1]) == 0xAB and int(array.sum()) == 0xAB * array.size
        del array
    assert region.state == "closed" and not region.leaked


def test_invalid_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="positive int"):
        open_region(0)
    with pytest.raises(ValueError, match="huge_pages must be one of"):
        open_region(MIB, huge_pages="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a policy needs nodes"):
        open_region(MIB, numa_policy="bind")
    with pytest.raises(ValueError, match=">= 0"):
        open_region(MIB, numa_policy="bind", numa_nodes=[-1])


@needs_numa
def test_prefault_uses_populate_write_and_every_sampled_page_is_present() -> None:
    with open_region(8 * MIB, prefault=True) as region:
        audit = region.audit()
    expected = "populate_write" if _os.has_populate_write() else "touch"
    assert audit.prefaulted and audit.prefault_method == expected
    assert audit.numa_sampled_pages == audit.numa_total_pages == 8 * MIB // _os.page_size()
    assert "not_present" not in audit.pages_per_node


def test_prefault_holds_the_mmap_lock_one_chunk_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """MADV_POPULATE_WRITE holds the process's mmap_lock for its whole range, and every mmap,
    munmap and then page fault of the process waits behind it (tier.PREFAULT_CHUNK says what
    that cost): the region is faulted in by calls of at most PREFAULT_CHUNK bytes that cover it
    exactly once, in order."""
    if not _os.has_populate_write():
        pytest.skip("kernel older than 5.14: no MADV_POPULATE_WRITE (pages are touched instead)")
    calls: list[tuple[int, int]] = []
    real = _os.madvise

    def record(mm: Any, advice: int, start: int = 0, length: int | None = None) -> None:
        if advice == _os.MADV_POPULATE_WRITE:
            assert length is not None
            calls.append((start, length))
        real(mm, advice, start, length)

    monkeypatch.setattr(_os, "madvise", record)
    size = 2 * tier.PREFAULT_CHUNK + 3 * MIB
    with open_region(size, prefault=True) as region:
        assert region.audit().prefault_method == "populate_write"
        offset = region._offset
    assert len(calls) == 3 and max(length for _, length in calls) <= tier.PREFAULT_CHUNK
    ends = [start + length for start, length in calls]
    assert [start for start, _ in calls] == [offset, *ends[:-1]] and ends[-1] >= offset + size


@needs_numa
def test_audit_samples_at_most_4096_pages() -> None:
    with open_region(64 * MIB) as region:
        audit = region.audit()
    assert audit.numa_sampled_pages == 4096 < audit.numa_total_pages
    assert audit.pages_per_node == {"not_present": 4096}


def test_dontfork_is_set_on_the_region() -> None:
    with open_region(4 * MIB) as region:
        assert "dc" in _os.smaps_vm_flags(region.address, region.size)  # proc(5): no copy on fork


def test_forked_child_cannot_touch_the_region() -> None:
    """MADV_DONTFORK proven the hard way: the child's write faults (SIGSEGV), the parent's works."""
    with open_region(2 * MIB) as region:
        array = region.array
        array[:] = 1
        pid = os.fork()
        if pid == 0:  # child: never return into pytest
            try:
                faulthandler.disable()  # no traceback noise from the expected crash
                array[0] = 2
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSEGV
        assert int(array[0]) == 1
        del array


# --- huge pages -------------------------------------------------------------------------------


@needs_thp
def test_huge_pages_prefer_with_prefault_gets_huge_pages(caplog: pytest.LogCaptureFixture):
    with open_region(64 * MIB, prefault=True, huge_pages="prefer") as region:
        audit = region.audit()
        assert region.address % _os.huge_page_size() == 0
        assert "hg" in _os.smaps_vm_flags(region.address, region.size)
    assert audit.huge_page_bytes > 0 and audit.huge_pages_obtained
    assert audit.fallbacks == () and _warnings(caplog) == []


@needs_thp
def test_huge_pages_require_without_prefault_probes_the_first_huge_page() -> None:
    with open_region(8 * MIB, huge_pages="require") as region:
        audit = region.audit()
    assert not audit.prefaulted
    assert 0 < audit.huge_page_bytes <= 8 * MIB


@needs_thp
def test_region_aligns_itself_when_the_kernel_does_not(tmp_path: Path) -> None:
    """Faked: 64 MiB huge pages, so the kernel's own 2 MiB alignment of large anonymous maps is
    (almost always) not enough and open_region must over-map and align the region itself."""
    thp = tmp_path / "kernel/mm/transparent_hugepage"
    thp.mkdir(parents=True)
    (thp / "enabled").write_text("always [madvise] never\n")
    (thp / "hpage_pmd_size").write_text(f"{64 * MIB}\n")
    with _os.use_roots(sys=tmp_path), open_region(MIB, huge_pages="prefer") as region:
        assert region.address % (64 * MIB) == 0
        audit = region.audit()
        region.array[:] = 3  # all usable bytes are inside the mapping
    assert audit.mapped_bytes == 64 * MIB and audit.fallbacks == ()


def test_huge_pages_prefer_without_thp_warns_once(no_thp: None, caplog):
    with open_region(4 * MIB, prefault=True, huge_pages="prefer") as region:
        audit = region.audit()
    assert [what for what, _ in audit.fallbacks] == ["huge_pages"]
    assert "THP mode is never" in audit.fallbacks[0][1]
    assert len(_warnings(caplog)) == 1


def test_huge_pages_require_without_thp_raises_with_the_fix(no_thp: None) -> None:
    with pytest.raises(PlacementError, match="echo madvise >") as info:
        open_region(4 * MIB, huge_pages="require")
    assert "THP mode is never" in str(info.value)


# --- NUMA -------------------------------------------------------------------------------------


@needs_numa
def test_bind_home_node_touched_pages_there_untouched_not_present() -> None:
    node = home_node()
    with open_region(8 * MIB, numa_policy="bind", numa_nodes=[node], numa_mode="require") as region:
        array = region.array
        array[: 4 * MIB] = 1  # the last 2 MiB stay untouched even with THP (see test_os)
        del array
        audit = region.audit()
        page = _os.page_size()
        tail = _os.move_pages_query(region.address + np.arange(6 * MIB, 8 * MIB, page))
    assert (audit.numa_policy_obtained, audit.numa_nodes_obtained) == ("bind", (node,))
    assert set(audit.pages_per_node) == {node, "not_present"}
    assert audit.pages_per_node[node] >= 4 * MIB // page
    assert set(tail.tolist()) == {-errno.ENOENT}
    assert audit.fallbacks == ()


@needs_numa
@pytest.mark.parametrize("policy", ["preferred", "interleave"])
def test_other_policies_read_back(policy: str) -> None:
    node = home_node()
    with open_region(MIB, numa_policy=policy, numa_nodes=[node], prefault=True) as region:  # type: ignore[arg-type]
        audit = region.audit()
    assert audit.numa_policy_obtained == policy
    assert set(audit.pages_per_node) == {node}


def test_require_an_absent_node_names_it_and_the_online_nodes() -> None:
    node = absent_node()
    with pytest.raises(PlacementError) as info:
        open_region(MIB, numa_policy="bind", numa_nodes=[node], numa_mode="require")
    text = str(info.value)
    assert f"node(s) {node} not online" in text
    assert f"online nodes: {_os.format_node_list(_os.online_nodes())}" in text
    assert "fix: choose numa_nodes from the online nodes" in text


def test_prefer_an_absent_node_warns_once_and_counts_a_fallback(caplog) -> None:
    node = absent_node()
    with open_region(MIB, numa_policy="bind", numa_nodes=[node], prefault=True) as region:
        audit = region.audit()
    assert len(audit.fallbacks) == 1 and audit.fallbacks[0][0] == "numa"
    assert f"node(s) {node} not online" in audit.fallbacks[0][1]
    assert len(_warnings(caplog)) == 1
    assert audit.numa_policy_obtained in ("default", "unknown")


@needs_numa
def test_a_faked_node_passes_validation_but_mbind_refuses_it(one_more_node: int, caplog) -> None:
    with open_region(MIB, numa_policy="bind", numa_nodes=[one_more_node]) as region:
        audit = region.audit()
    assert len(audit.fallbacks) == 1
    what, why = audit.fallbacks[0]
    assert what == "numa" and "mbind failed with" in why and "not online" not in why
    assert len(_warnings(caplog)) == 1
    with pytest.raises(PlacementError, match="mbind failed with E"):
        open_region(MIB, numa_policy="bind", numa_nodes=[one_more_node], numa_mode="require")


@needs_numa
def test_interleave_over_a_fake_two_node_sys(tmp_path: Path, caplog) -> None:
    """Faked: /sys says nodes 0 and 1 are online, because this CI host has one node. Validation
    trusts /sys; the kernel decides what it keeps: both nodes where it has them; else mbind
    keeps the nodes it has and silently drops the other (or refuses when none is left), which
    the audit must report as a fallback (``prefer``) or an error (``require``)."""
    kept = tuple(n for n in (0, 1) if n in real_nodes())
    with _os.use_roots(sys=fake_sys_nodes(tmp_path, (0, 1))):
        assert _os.online_nodes() == (0, 1)
        with open_region(2 * MIB, numa_policy="interleave", numa_nodes=[0, 1]) as region:
            audit = region.audit()
        if kept != (0, 1):
            with pytest.raises(PlacementError, match="mode require"):
                open_region(MIB, numa_policy="interleave", numa_nodes=[0, 1], numa_mode="require")
    assert audit.numa_nodes_requested == (0, 1)
    if kept == (0, 1):
        assert (audit.numa_policy_obtained, audit.numa_nodes_obtained) == ("interleave", (0, 1))
        assert audit.fallbacks == ()
        return
    assert [what for what, _ in audit.fallbacks] == ["numa"]
    assert len(_warnings(caplog)) == 1
    if kept:
        assert audit.numa_nodes_obtained == kept
        missing = _os.format_node_list([n for n in (0, 1) if n not in kept])
        assert f"the kernel dropped node(s) {missing}" in audit.fallbacks[0][1]
    else:
        assert "mbind failed with" in audit.fallbacks[0][1]


# --- audit rendering --------------------------------------------------------------------------


def test_audit_to_dict_is_json_and_format_is_readable() -> None:
    nodes = [real_nodes()[0], absent_node()]  # the second one makes a fallback to render
    with open_region(MIB, name="json", numa_policy="bind", numa_nodes=nodes) as region:
        audit = region.audit()
    assert isinstance(audit, PlacementAudit)
    data = json.loads(json.dumps(audit.to_dict()))
    assert data["name"] == "json" and data["numa_nodes_requested"] == nodes
    assert data["fallbacks"][0][0] == "numa"
    text = format_audit(audit)
    assert "tier 'json'" in text and "fallback     numa" in text
    hash(audit)  # frozen and hashable although pages_per_node is a dict


# --- close --------------------------------------------------------------------------------------


def test_close_is_idempotent_and_waits_once() -> None:
    region = open_region(MIB)
    calls: list[int] = []
    region.close(wait=lambda: calls.append(1))
    region.close(wait=lambda: calls.append(2))
    region.close()
    assert calls == [1] and region.state == "closed" and not region.leaked
    assert region.audit().state == "closed"


def test_access_after_close_raises_closed_error() -> None:
    region = open_region(MIB, name="gone")
    region.close()
    with pytest.raises(ClosedError, match="'gone' is closed"):
        _ = region.array
    with pytest.raises(ClosedError):
        _ = region.address


def test_close_with_a_live_view_leaks_instead_of_unmapping(caplog) -> None:
    region: Region = open_region(MIB, name="leaky")
    view = region.array[10:20]
    view[:] = 42
    region.close()
    assert region.state == "closed" and region.leaked
    assert region.audit().leaked
    assert int(view.sum()) == 420  # still mapped: the view reads what it wrote
    assert any("not unmapping" in r.getMessage() for r in _warnings(caplog))
    with pytest.raises(ClosedError):
        _ = region.array


def test_a_failing_wait_leaks_and_reraises() -> None:
    region = open_region(MIB)

    def wait() -> None:
        raise TimeoutError("transfer still running")

    with pytest.raises(TimeoutError):
        region.close(wait=wait)
    assert region.state == "closed" and region.leaked


@pytest.mark.skipif(
    Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1",
    reason="vm.overcommit_memory=1 maps any size: the kernel refuses nothing to test",
)
def test_a_region_the_kernel_refuses_to_map_is_a_capacity_error() -> None:
    """Real: 128 TiB is more than this host's memory and swap (heuristic overcommit)."""
    with pytest.raises(CapacityError, match="the kernel refused to map"):
        open_region(1 << 47, name="huge")
