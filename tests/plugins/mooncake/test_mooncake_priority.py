"""``backend.options.call_priority``: where the store calls run, and at what priority.

The decision of ``auto`` is tested with injected loads (a test never depends on the load of
the moment); the SCHED_IDLE policy itself is a real syscall, read back from the thread that ran
the call; the store calls themselves run on a real ``mooncake_master`` and segment process. A
host that refuses SCHED_IDLE (this machine allows it) is faked by injecting the failing call.
No speed is asserted (``kvcr-policy bench`` shows it).
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.errors import PluginError
from kvcr_policy.geometry import PoolGeometry
from tests.plugins.mooncake.mooncake_helpers import PLUGIN_DIST, pipeline_on
from tests.support.installs import missing
from tests.support.pools import fresh_keys, page_bytes, pool_buffer, raw_bytes, token_indices

try:
    from kvcr_policy_mooncake.priority import (
        CallThreads,
        Load,
        choose_idle,
        cpu_quota,
        cpus_available,
        idle_refused,
        load,
        running_tasks,
    )
except ImportError:  # the plugin is not installed: every test here skips (or fails under CI)
    CallThreads = None  # type: ignore[assignment,misc]


@pytest.fixture(autouse=True)
def _plugin() -> None:
    if CallThreads is None:
        missing(f"{PLUGIN_DIST} is not installed; pip install -e plugins/kvcr-policy-mooncake")


def _policy() -> int:
    """The calling thread's scheduling policy."""
    return os.sched_getscheduler(0)


def _idle_policy_threads() -> set[int]:
    """Native ids of this process's threads whose policy is SCHED_IDLE."""
    found = set()
    for task in os.listdir("/proc/self/task"):
        try:
            if os.sched_getscheduler(int(task)) == os.SCHED_IDLE:
                found.add(int(task))
        except OSError:  # the thread ended meanwhile
            continue
    return found


def _refuse() -> None:
    raise PermissionError(errno.EPERM, "Operation not permitted")


# ---- reading the load --------------------------------------------------------------------


def test_running_tasks_are_read_from_proc_loadavg_text() -> None:
    assert running_tasks("1.21 2.28 2.48 3/115 29576\n") == 3
    assert running_tasks("1.21 2.28 2.48\n") is None
    assert running_tasks("1.21 2.28 2.48 many/115 29576\n") is None
    assert running_tasks("1.21 2.28 2.48 3 29576\n") is None
    assert running_tasks("") is None


@pytest.mark.parametrize(
    ("text", "cores"),
    [("max 100000\n", None), ("200000 100000\n", 2.0), ("150000 100000", 1.5), ("", None),
     ("10 0", None), ("a b", None)],
)  # fmt: skip
def test_a_cgroup_quota_is_read_as_cores(text: str, cores: float | None) -> None:
    assert cpu_quota(text) == cores


def test_the_load_of_this_host_is_read(tmp_path: Path) -> None:
    now = load()
    assert now is not None
    assert now.running >= 1  # the thread reading it runs
    assert 1 <= now.cpus <= len(os.sched_getaffinity(0))


def test_a_cgroup_quota_bounds_the_cores_and_a_missing_count_is_unknown(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("0.50 0.40 0.30 5/200 4242\n")
    membership = tmp_path / "cgroup"
    membership.write_text("0::/team/kv\n")
    (tmp_path / "fs" / "team" / "kv").mkdir(parents=True)
    (tmp_path / "fs" / "team" / "kv" / "cpu.max").write_text("150000 100000\n")
    affinity = len(os.sched_getaffinity(0))
    assert load(stat, cpus_available(tmp_path / "fs", membership)) == Load(5, min(2, affinity))
    (tmp_path / "fs" / "team" / "kv" / "cpu.max").write_text("max 100000\n")
    assert load(stat, cpus_available(tmp_path / "fs", membership)) == Load(5, affinity)
    stat.write_text("0.50 0.40 0.30\n")
    assert load(stat) is None
    assert load(tmp_path / "absent") is None


# ---- the decision of auto ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("running", "in_flight", "idle"),
    [
        (1, 0, True),  # 2 cores, only the asking thread: both free
        (2, 0, True),  # one busy task: one core left for the transfer and its poller
        (3, 0, False),  # two busy tasks: every core taken, a poller would starve
        (3, 1, True),  # ... unless one of them is this process's own call
        (4, 1, False),
    ],
)
def test_auto_is_idle_only_while_a_core_is_left_over(
    running: int, in_flight: int, idle: bool
) -> None:
    assert choose_idle(Load(running, 2), in_flight) is idle


def test_an_unknown_load_keeps_the_normal_priority() -> None:
    assert choose_idle(None, 0) is False


@given(
    running=st.integers(1, 512),
    more=st.integers(0, 64),
    cpus=st.integers(1, 256),
    in_flight=st.integers(0, 16),
)
def test_more_load_never_turns_normal_into_idle(
    running: int, more: int, cpus: int, in_flight: int
) -> None:
    if not choose_idle(Load(running, cpus), in_flight):
        assert not choose_idle(Load(running + more, cpus), in_flight)
    if choose_idle(Load(running, cpus), in_flight):
        assert choose_idle(Load(running, cpus + more), in_flight)
    # every core busy with other tasks: never idle
    assert not choose_idle(Load(cpus + 1 + in_flight, cpus), in_flight)


# ---- where the calls run (real threads, real scheduling policies) ------------------------


def test_normal_runs_the_call_on_the_callers_thread_at_its_priority() -> None:
    calls = CallThreads("normal", 2)
    try:
        here = threading.get_ident()
        assert calls.call(lambda: (threading.get_ident(), _policy())) == (here, _policy())
        assert calls.describe()["calls_normal"] == 1
    finally:
        calls.close()


def test_idle_runs_the_call_on_a_sched_idle_thread_and_passes_errors_back() -> None:
    calls = CallThreads("idle", 2)
    try:
        ident, policy = calls.call(lambda: (threading.get_ident(), _policy()))
        assert ident != threading.get_ident()
        assert policy == os.SCHED_IDLE
        assert _policy() == os.SCHED_OTHER  # the caller's own thread is left alone

        def fails() -> None:
            raise KeyError("from the call")

        with pytest.raises(KeyError, match="from the call"):
            calls.call(fails)
        assert calls.describe()["calls_idle"] == 2
    finally:
        calls.close()


def test_auto_follows_the_measured_load_before_each_call() -> None:
    loads = iter([Load(3, 2), Load(1, 2), Load(3, 2)])
    calls = CallThreads("auto", 2, measure=lambda: next(loads))
    try:
        policies = [calls.call(_policy) for _ in range(3)]
        assert policies == [os.SCHED_OTHER, os.SCHED_IDLE, os.SCHED_OTHER]
        described = calls.describe()
        assert (described["calls_idle"], described["calls_normal"]) == (1, 2)
        assert described["last_load"] == {"running": 3, "cpus": 2}
    finally:
        calls.close()


def test_auto_counts_this_process_calls_in_flight() -> None:
    seen: list[int] = []
    started = threading.Barrier(2)
    release = threading.Event()

    def decide(now: Load | None, in_flight: int) -> bool:
        seen.append(in_flight)
        return True

    def hold() -> int:
        started.wait(timeout=60)
        release.wait(timeout=60)
        return _policy()

    calls = CallThreads("auto", 2, measure=lambda: Load(1, 2), decide=decide)
    try:
        first = threading.Thread(target=calls.call, args=(hold,))
        first.start()
        started.wait(timeout=60)  # the first call is in flight
        release.set()
        assert calls.call(_policy) == os.SCHED_IDLE
        first.join(timeout=60)
        assert seen == [0, 1]
    finally:
        release.set()
        calls.close()


def test_a_host_refusing_sched_idle_fails_idle_clearly_and_keeps_auto_normal() -> None:
    assert idle_refused() is None  # this machine allows it
    why = idle_refused(_refuse)
    assert why is not None and "Operation not permitted" in why
    where = "profile p.toml"
    with pytest.raises(PluginError) as caught:
        CallThreads("idle", 2, where, set_idle=_refuse)
    message = str(caught.value)
    assert "from profile p.toml" in message and "SCHED_IDLE" in message
    assert "'normal'" in message and "'auto'" in message
    calls = CallThreads("auto", 2, measure=lambda: Load(1, 2), set_idle=_refuse)
    try:
        assert calls.call(_policy) == os.SCHED_OTHER
        assert calls.describe()["refused"] == why
    finally:
        calls.close()


# ---- the backend: options, profiles, store calls on a real store -------------------------


@pytest.mark.mooncake
@pytest.mark.slow
@pytest.mark.parametrize(("profile", "mode"), [("default", "normal"), ("throughput", "auto")])
def test_the_default_follows_the_profiles_coalescing(master: Any, profile: str, mode: str) -> None:
    values = {"backend.name": "mooncake", "backend.options.master": master.address,
              "backend.options.segment_bytes": 0}  # fmt: skip
    with build_pipeline(load_config(profile=profile, environ={}, overrides=values)) as pipeline:
        assert pipeline.stats().transport["call_priority"]["mode"] == mode


@pytest.mark.mooncake
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["idle", "auto", "normal"])
def test_pages_move_byte_exact_under_every_priority(
    master: Any, segment: Any, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored and restored (and the limit probe read) through the calls ``mode`` chooses:
    every byte arrives, and each call ran on a thread of the policy the mode says."""
    from kvcr_policy_mooncake import priority

    policies: list[int] = []
    through = priority.CallThreads.call

    def spy(self: Any, work: Any, *args: Any) -> Any:
        def run(*inner: Any) -> Any:
            policies.append(_policy())
            return work(*inner)

        return through(self, run, *args)

    monkeypatch.setattr(priority.CallThreads, "call", spy)
    if mode == "auto":  # a quiet host, injected: the load of the moment decides nothing here
        monkeypatch.setattr(priority, "load", lambda **_: Load(1, 2))
    geometry = PoolGeometry(f"kv-{mode}", "layer_first", 4, 2, 8, "float16", 4, 64)
    buffer = pool_buffer(geometry)
    raw = raw_bytes(buffer)
    raw[:] = np.random.default_rng(7).integers(0, 256, raw.size, dtype=np.uint8)
    with pipeline_on(master, backend__options__call_priority=mode) as pipeline:
        pipeline.register_pool(geometry.name, geometry, buffer)
        keys = fresh_keys(2)
        expected = [page_bytes(buffer, geometry, p) for p in (0, 1)]
        assert pipeline.set(keys, token_indices([0, 1], geometry.page_size), geometry.name) == [
            True,
            True,
        ]
        raw[:] = 0
        got = pipeline.get(keys, token_indices([2, 3], geometry.page_size), geometry.name)
        assert got == [True, True]
        assert [page_bytes(buffer, geometry, p) for p in (2, 3)] == expected
        pipeline.probe(geometry.page_bytes)
        described = pipeline.stats().transport["call_priority"]
        # Mooncake started no thread from inside a call (it would have inherited the policy)
        assert _idle_policy_threads() <= pipeline.backend.calls.idle_threads
    want = os.SCHED_OTHER if mode == "normal" else os.SCHED_IDLE
    assert policies and set(policies) == {want}
    assert described["mode"] == mode
    assert described["calls_idle" if want == os.SCHED_IDLE else "calls_normal"] == len(policies)
