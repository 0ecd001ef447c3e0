"""Tests for kvcr_policy.memory.headroom: which limit binds, read from /proc and /sys.

Memory cgroups with limits, other hosts' memory and a reserved huge-page pool are what this
machine does not have (its own cgroup has no limit): they are faked as written /proc and /sys
trees (``tests.support.cgroups.FakeHost``), read through ``use_roots``. The address-space limit
is real: a child process sets it before it reads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import given

from kvcr_policy.memory.headroom import Headroom, read_headroom
from kvcr_policy.memory.linux import use_roots
from tests.strategies import memory_limits
from tests.support.cgroups import GIB, MIB, FakeHost


def _read(host: FakeHost, **kwargs: bool) -> Headroom:
    with use_roots(proc=host.proc, sys=host.sys):
        return read_headroom(**kwargs)


def test_a_v2_ancestor_limit_binds_less_its_reclaimable_page_cache(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.v2("/pod/app")
    pod = host.limit_v2("/sys/fs/cgroup/pod", 600 * MIB, current=100 * MIB, inactive=40 * MIB)
    host.limit_v2("/sys/fs/cgroup/pod/app", None, current=90 * MIB)
    binding = _read(host).now()
    assert binding is not None and binding.limit.name == "cgroup v2 memory.max"
    assert binding.limit.source == str(pod / "memory.max")
    assert binding.available == 540 * MIB  # 600 - (100 - 40 inactive file pages)
    assert binding.limit.in_use == 60 * MIB and binding.limit.total == 600 * MIB


def test_the_tightest_v1_cgroup_along_the_path_binds_on_a_hybrid_host(tmp_path: Path) -> None:
    """This machine's layout: v1 memory at /sys/fs/cgroup/memory, cgroup2 (no memory files) at
    /sys/fs/cgroup/unified."""
    host = FakeHost(tmp_path)
    host.v1("/process_api/abc")
    host.v2("/", mount="/sys/fs/cgroup/unified")
    (host.sys / "fs/cgroup/unified").mkdir(parents=True)
    root = "/sys/fs/cgroup/memory"
    host.limit_v1(root, None, usage=20 * GIB)
    parent = host.limit_v1(f"{root}/process_api", 1 * GIB, usage=900 * MIB, inactive=0)
    leaf = host.limit_v1(f"{root}/process_api/abc", 600 * MIB, usage=100 * MIB)
    headroom = _read(host)
    now = headroom.now()
    assert now is not None and now.available == 124 * MIB  # the parent: 1 GiB - 900 MiB
    assert now.limit.source == str(parent / "memory.limit_in_bytes") and now.limit.shared
    grow = headroom.grow()  # the parent is shared with its other children: held to its total
    assert grow is not None and grow.available == 500 * MIB
    assert grow.limit.source == str(leaf / "memory.limit_in_bytes") and not grow.limit.shared
    host_view = headroom.host()
    assert host_view is not None and host_view.available == 600 * MIB


def test_without_a_limited_cgroup_memavailable_binds_and_a_growing_tier_gets_memtotal(
    tmp_path: Path,
) -> None:
    host = FakeHost(tmp_path, total=32 * GIB, available=5 * GIB)
    host.v1("/")
    host.limit_v1("/sys/fs/cgroup/memory", None, usage=27 * GIB)  # the root: unlimited
    headroom = _read(host)
    assert [limit.name for limit in headroom.limits] == ["MemAvailable"]
    now, grow = headroom.now(), headroom.grow()
    assert now is not None and now.available == 5 * GIB
    assert now.limit.source == str(host.proc / "meminfo")
    assert grow is not None and grow.available == 32 * GIB and grow.limit.total_name == "MemTotal"


def test_a_container_that_mounts_its_own_cgroup_as_root_reads_it_there(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.v2("/kubepods/pod1/ctr", root="/kubepods/pod1/ctr")
    mine = host.limit_v2("/sys/fs/cgroup", 2 * GIB, current=GIB)
    binding = _read(host).now()
    assert binding is not None and binding.limit.source == str(mine / "memory.max")
    assert binding.available == GIB


def test_another_cgroup_namespace_leaves_the_mount_point(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.v2("/somewhere/not/mounted/here")
    host.limit_v2("/sys/fs/cgroup", 3 * GIB, current=GIB)
    binding = _read(host).now()
    assert binding is not None and binding.available == 2 * GIB


def test_a_v1_parent_without_hierarchy_does_not_charge_its_children(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.v1("/a/b")
    root = "/sys/fs/cgroup/memory"
    host.limit_v1(f"{root}/a", 100 * MIB, usage=99 * MIB, hierarchy=False)
    host.limit_v1(f"{root}/a/b", 2 * GIB, usage=GIB)
    binding = _read(host).now()
    assert binding is not None and binding.available == GIB


def test_the_huge_page_pool_counts_only_when_asked(tmp_path: Path) -> None:
    host = FakeHost(tmp_path)
    host.meminfo(32 * GIB, 16 * GIB, huge=(512, 100, 2 * MIB))
    assert _read(host).now().limit.name == "MemAvailable"  # type: ignore[union-attr]
    pooled = _read(host, hugetlb=True).now()
    assert pooled is not None and pooled.limit.name == "HugePages_Free"
    assert pooled.available == 200 * MIB and pooled.limit.total == GIB


def test_nothing_readable_binds_nothing(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    with use_roots(proc=tmp_path / "proc", sys=tmp_path / "sys"):
        headroom = read_headroom()
    assert headroom.limits == () and headroom.now() is None and headroom.host() is None


_RLIMIT_CHILD = """
import json, re, resource
size = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) << 10
resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))
from kvcr_policy.memory.headroom import read_headroom
binding = read_headroom().now()
print(json.dumps([binding.limit.name, binding.limit.source, binding.available]))
"""


def test_the_address_space_limit_binds_a_process_that_has_one() -> None:
    """Real: a child process sets RLIMIT_AS to its size + 1 GiB, then reads."""
    done = subprocess.run([sys.executable, "-c", _RLIMIT_CHILD], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    name, source, available = json.loads(done.stdout)
    assert (name, source) == ("RLIMIT_AS", "getrlimit(RLIMIT_AS)")
    assert 0 < available < GIB  # the imports after setrlimit grew it


@given(memory_limits())
def test_a_tier_taken_at_once_never_gets_more_than_one_that_grows(headroom: Headroom) -> None:
    now, grow = headroom.now(), headroom.grow()
    assert now is not None and grow is not None and now.available <= grow.available
    assert now.available == min(max(0, limit.available) for limit in headroom.limits)
    assert now.limit in headroom.limits and grow.limit in headroom.limits
    if all(limit.scope != "process" for limit in headroom.limits):
        host = headroom.host()
        assert host is not None and grow.available <= host.available
