"""Tests for kvcr_policy.memory.preflight: which tier is refused, and what the message says.

The limits are faked (``tests.support.cgroups.FakeHost``: this machine's own cgroup has no
limit and its memory is what it is); the decisions and messages are the real ones. The same
refusal in a real memory cgroup is in tests/config/test_preflight_in_a_cgroup.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvcr_policy.errors import CapacityError, TierMemoryError
from kvcr_policy.memory.linux import use_roots
from kvcr_policy.memory.preflight import TierRequest, check_host, check_tier, mapped_bytes
from tests.support.cgroups import GIB, MIB, FakeHost

ORIGIN = "env KVCR_POLICY_PLACEMENT__CAPACITY_BYTES"


@pytest.fixture
def pod(tmp_path: Path) -> FakeHost:
    """A 32 GiB host, 16 GiB free; this process in a v1 cgroup of 600 MiB, 100 MiB in use."""
    host = FakeHost(tmp_path, total=32 * GIB, available=16 * GIB)
    host.v1("/pod")
    host.limit_v1("/sys/fs/cgroup/memory/pod", 600 * MIB, usage=130 * MIB, inactive=30 * MIB)
    return host


def _check(host: FakeHost, request: TierRequest, capacity: int) -> None:
    with use_roots(proc=host.proc, sys=host.sys):
        check_tier(request, capacity, ORIGIN)


def test_a_prefaulted_tier_above_the_cgroup_is_refused_with_everything_to_fix_it(
    pod: FakeHost,
) -> None:
    request = TierRequest("the tier of pool 'kv'", 2 * GIB, committed=True)
    with pytest.raises(TierMemoryError) as caught:
        _check(pod, request, 2 * GIB)
    text = str(caught.value)
    limit = pod.sys / "fs/cgroup/memory/pod/memory.limit_in_bytes"
    assert text.startswith(f"placement.capacity_bytes = 2GiB (from {ORIGIN}) is more than")
    assert "the tier of pool 'kv' takes 2GiB at once" in text
    assert f"cgroup v1 memory.limit_in_bytes leaves 500MiB of 600MiB ({limit}; 100MiB" in text
    assert "lower placement.capacity_bytes to at most 500MiB" in text
    assert f"or raise memory.limit_in_bytes of {limit.parent}" in text
    assert isinstance(caught.value, CapacityError)


def test_a_tier_that_grows_is_held_to_its_own_cgroup_as_well(pod: FakeHost) -> None:
    with pytest.raises(TierMemoryError, match="grows to 2GiB as pages arrive"):
        _check(pod, TierRequest("the tier of pool 'kv'", 2 * GIB, committed=False), 2 * GIB)
    _check(pod, TierRequest("the tier of pool 'kv'", 400 * MIB, committed=False), 400 * MIB)


def test_a_growing_tier_above_what_is_free_warns_and_above_the_host_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    host = FakeHost(tmp_path, total=32 * GIB, available=5 * GIB)
    with caplog.at_level(logging.WARNING, logger="kvcr_policy.memory.preflight"):
        _check(host, TierRequest("the tier of pool 'kv'", 16 * GIB, committed=False), 16 * GIB)
    assert "MemAvailable leaves 5GiB of 32GiB" in caplog.text
    with pytest.raises(TierMemoryError) as caught:
        _check(host, TierRequest("the tier of pool 'kv'", 48 * GIB, committed=False), 48 * GIB)
    assert f"and MemTotal is 32GiB ({host.proc / 'meminfo'})" in str(caught.value)
    with pytest.raises(TierMemoryError, match="MemAvailable leaves 5GiB"):
        _check(host, TierRequest("the tier of pool 'kv'", 16 * GIB, committed=True), 16 * GIB)


def test_the_tiers_opened_before_count_against_the_next(pod: FakeHost) -> None:
    _check(pod, TierRequest("the tier of pool 'kv'", 300 * MIB, committed=False), 300 * MIB)
    second = TierRequest("the tier of pool 'v'", 300 * MIB, committed=False, pending=300 * MIB)
    with pytest.raises(TierMemoryError) as caught:
        _check(pod, second, 300 * MIB)
    text = str(caught.value)
    assert "besides the 300MiB that the tiers opened before it grow to" in text
    assert "at most 200MiB" in text


def test_the_host_question_ignores_what_is_in_use(pod: FakeHost) -> None:
    """validate: 500 MiB fits a 600 MiB cgroup whatever runs in it now; 2 GiB never does."""
    with use_roots(proc=pod.proc, sys=pod.sys):
        binding = check_host(500 * MIB, ORIGIN)
        assert binding is not None and binding.available == 600 * MIB
        with pytest.raises(TierMemoryError) as caught:
            check_host(2 * GIB, ORIGIN)
    text = str(caught.value)
    assert "is more than the memory this host holds: each pool's tier grows to 2GiB" in text
    assert "cgroup v1 memory.limit_in_bytes is 600MiB" in text


def test_nothing_readable_refuses_nothing(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    with use_roots(proc=tmp_path / "proc", sys=tmp_path / "sys"):
        request = TierRequest("the tier of pool 'kv'", 1 << 50, committed=True)
        assert check_tier(request, 1 << 50, ORIGIN) is None


def test_a_region_maps_whole_huge_pages(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel/mm/transparent_hugepage").mkdir(parents=True)
    (tmp_path / "sys/kernel/mm/transparent_hugepage/hpage_pmd_size").write_text("2097152\n")
    with use_roots(sys=tmp_path / "sys"):
        assert mapped_bytes(1) == 2 * MIB and mapped_bytes(4 * MIB) == 4 * MIB
        assert mapped_bytes(4 * MIB + 1) == 6 * MIB


def test_a_refused_size_is_echoed_as_written_with_its_binary_size(pod: FakeHost) -> None:
    """validate --set placement.capacity_bytes=2GB: the message says 2GB (1.9 GiB), not 1.86GiB."""
    with use_roots(proc=pod.proc, sys=pod.sys), pytest.raises(TierMemoryError) as caught:
        check_host(2 * 10**9, ORIGIN, written="2GB")
    assert f"placement.capacity_bytes = 2GB (1.9 GiB) (from {ORIGIN})" in str(caught.value)
