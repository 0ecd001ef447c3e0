"""The ``host`` backend: one tier per host for every process, started by the first that needs it.

Real processes, a real ``flock``, real SIGKILLs of the tier process; pages checked byte for byte.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.errors import BackendUnavailableError, ConfigError
from kvcr_policy.memory.cpus import cpu_list
from tests.support.cpus import needs_two_cpus, on_pinned_thread
from tests.support.host_tiers import stop_host_tiers, tier_pid
from tests.support.paths import ROOT
from tests.support.pools import geometry, pages_of, pool_buffer, token_indices
from tests.support.waiting import wait_until


def host_values(folder: Path, **more: Any) -> dict[str, Any]:
    return {
        "backend.name": "host",
        "backend.options.dir": str(folder),
        "placement.capacity_bytes": "16MiB",
        **more,
    }


@pytest.fixture
def folder(tmp_path: Path) -> Any:
    path = tmp_path / "tiers"
    yield path
    stop_host_tiers(path)


WRITER = """
import sys, json
from kvcr_policy import build_pipeline, load_config
from tests.support.pools import geometry, pool_buffer, token_indices
values = json.loads(sys.argv[1])
with build_pipeline(load_config(overrides=values)) as pipeline:
    geo = geometry("page_first", pages=8)
    pipeline.register_pool("kv", geo, pool_buffer(geo, int(sys.argv[2])))
    keys = [f"w{sys.argv[3]}-{i}" for i in range(4)]
    ok = pipeline.set(keys, token_indices(range(4), geo.page_size), "kv")
    print(json.dumps({"ok": ok, "transport": pipeline.backend.describe()["transport_used"]}))
"""


def run_writer(values: dict[str, Any], seed: int, index: int) -> Any:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, json.dumps(values), str(seed), str(index)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_processes_share_one_tier_started_once(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No secret anywhere (the suite's servers made one in its XDG_CONFIG_HOME): the first
    # process makes the tier's own, and the writers (children) find it as this process does.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    values = host_values(folder)
    writers = [run_writer(values, 11, index) for index in range(4)]  # four start at once
    for writer in writers:
        out, err = writer.communicate(timeout=300)
        assert writer.returncode == 0, err[-3000:]
        assert json.loads(out) == {"ok": [True] * 4, "transport": "shm"}
    log = (folder / "default.log").read_text()
    assert log.count("host tier on unix:") == 1  # one tier, however many raced to start it
    pid = tier_pid(folder / "default.lock")
    assert pid is not None
    # Another process (this one) reads what they stored, byte for byte.
    with build_pipeline(load_config(overrides=values)) as pipeline:
        geo = geometry("page_first", pages=8)
        buffer = pool_buffer(geo, 0)
        pipeline.register_pool("kv", geo, buffer)
        keys = [f"w3-{i}" for i in range(4)]
        assert pipeline.get(keys, token_indices(range(4, 8), geo.page_size), "kv") == [True] * 4
        expected = pages_of(pool_buffer(geo, 11), geo)[:, :4]
        assert np.array_equal(pages_of(buffer, geo)[:, 4:8], expected)
    assert tier_pid(folder / "default.lock") == pid
    for name in ("default.secret", "default.log", "default.lock"):
        assert (folder / name).stat().st_mode & 0o077 == 0, name
    assert folder.stat().st_mode & 0o777 == 0o700


def test_an_idle_tier_exits_and_the_next_process_starts_one(folder: Path) -> None:
    values = host_values(folder, **{"backend.options.idle_exit_s": 0.5})
    with build_pipeline(load_config(overrides=values)) as pipeline:
        geo = geometry("page_first", pages=4)
        pipeline.register_pool("kv", geo, pool_buffer(geo))
        first = tier_pid(folder / "default.lock")
    assert first is not None
    wait_until(lambda: tier_pid(folder / "default.lock") is None, "the idle tier's exit", 60)
    with build_pipeline(load_config(overrides=values)) as pipeline:
        pipeline.register_pool("kv", geo, pool_buffer(geo))
        assert tier_pid(folder / "default.lock") not in (None, first)


@needs_two_cpus
def test_a_tier_started_from_a_thread_pinned_to_one_cpu_runs_on_every_cpu_of_its_starter(
    folder: Path,
) -> None:
    """vLLM's CPU worker pins its main thread to one core, starts the tier from it, and
    busy-polls that core between steps while its scheduler waits on the tier. A tier confined
    to that core waited there, runnable, for 24 s at a time on a loaded host (the scheduler's
    lookups timed out). Started from a thread pinned to one CPU, the tier and each of its
    threads run on every CPU of the starter's process."""
    everything = os.sched_getaffinity(0)
    values = host_values(folder)
    geo = geometry("page_first", pages=4)

    def start() -> Any:
        pipeline = build_pipeline(load_config(overrides=values))
        pipeline.register_pool("kv", geo, pool_buffer(geo))  # connects: starts the tier
        return pipeline

    pipeline = on_pinned_thread(min(everything), start)
    try:
        pid = tier_pid(folder / "default.lock")
        assert pid is not None
        threads = {
            int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")
        }
        assert threads and all(cpus == everything for cpus in threads.values()), threads
        assert f"(CPUs {cpu_list(everything)})" in (folder / "default.log").read_text()
        assert pipeline.set(["a"], token_indices(range(1), geo.page_size), "kv") == [True]
    finally:
        pipeline.close()


def test_a_tier_nobody_may_start_is_waited_for_then_reported(folder: Path) -> None:
    values = host_values(
        folder, **{"backend.options.start": False, "backend.options.start_timeout_s": 1}
    )
    pipeline = build_pipeline(load_config(overrides=values))
    geo = geometry("page_first", pages=4)
    with pytest.raises(BackendUnavailableError, match=r"start_timeout_s = 1\.0 s"):
        pipeline.register_pool("kv", geo, pool_buffer(geo))
    pipeline.close()


def test_a_starter_that_dies_before_its_tier_listens_is_replaced(folder: Path) -> None:
    """A process holds the tier's lock (as a tier does while it starts) and is SIGKILLed
    before anything listens: the waiting client sees the lock freed and starts the tier
    itself, instead of waiting out start_timeout_s for a socket that never comes."""
    folder.mkdir(mode=0o700)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n",
            str(folder / "default.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    threading.Timer(1.0, holder.kill).start()
    values = host_values(folder, **{"backend.options.start_timeout_s": 120})
    try:
        with build_pipeline(load_config(overrides=values)) as pipeline:
            geo = geometry("page_first", pages=4)
            pipeline.register_pool("kv", geo, pool_buffer(geo))
            assert pipeline.set(["a"], token_indices(range(1), geo.page_size), "kv") == [True]
    finally:
        holder.kill()
        holder.wait()
    assert tier_pid(folder / "default.lock") not in (None, holder.pid)


def test_a_folder_other_users_can_reach_is_refused(tmp_path: Path) -> None:
    open_folder = tmp_path / "open"
    open_folder.mkdir(mode=0o777)
    open_folder.chmod(0o777)
    with pytest.raises(ConfigError, match=r"(?s)backend\.options\.dir \(from override\).*others"):
        build_pipeline(load_config(overrides=host_values(open_folder)))


def page_of(key: str, page_bytes: int) -> np.ndarray:
    """The bytes stored under ``key``: made from the key alone, so any reader can check them."""
    seed = int.from_bytes(key.encode()[-8:].rjust(8, b"\0"), "little")
    return np.random.default_rng(seed).integers(0, 256, page_bytes, dtype=np.uint8)


@pytest.mark.slow
def test_kills_of_the_tier_during_stores_and_restores_never_yield_a_wrong_byte(
    folder: Path,
) -> None:
    """20 SIGKILLs of the tier process while one client stores and restores without pause:
    every page reported restored is exactly the bytes stored under its key (0 wrong bytes),
    and after each kill the client stores and restores again (a new tier, started by it)."""
    values = host_values(folder, **{"backend.options.idle_exit_s": 0})
    geo = geometry("page_first", pages=32, name="kv")
    kills, wrong, restored, recovered = 0, 0, 0, 0
    stop = threading.Event()
    killed_at: list[float] = []

    def killer() -> None:
        nonlocal kills
        rng = random.Random(7)
        while kills < 20 and not stop.is_set():
            pid = tier_pid(folder / "default.lock")
            if pid is None:
                time.sleep(0.05)
                continue
            time.sleep(rng.uniform(0.05, 0.6))  # some stores and restores of this tier first
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            kills += 1
            killed_at.append(time.monotonic())
            # The next kill is of a new tier, which the client starts. The client may also be
            # done with the last one already (its tier then exits, idle): the loop below bounds
            # the wait, by the client's round trips, not by a time.
            while tier_pid(folder / "default.lock") in (None, pid):
                if stop.wait(0.05):  # a poll of the lock file, ended by the client's last call
                    return

    values["transport.op_timeout_s"] = 5
    with build_pipeline(load_config(overrides=values)) as pipeline:
        buffer = pool_buffer(geo, 0)
        pipeline.register_pool("kv", geo, buffer)
        view = pages_of(buffer, geo)
        page_bytes = geo.page_bytes
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        step = 0
        last_ok = time.monotonic()
        try:
            while kills < 20 or not recovered_after_last(killed_at, last_ok):
                step += 1
                assert time.monotonic() - last_ok < 180, "no round trip for 180 s"
                keys = [f"k{step}-{i}" for i in range(8)]
                for i, key in enumerate(keys):
                    view[:, i] = page_of(key, page_bytes).reshape(view[:, i].shape)
                stored = pipeline.set(keys, token_indices(range(8), geo.page_size), "kv")
                view[:, 8:16] = 0
                got = pipeline.get(keys, token_indices(range(8, 16), geo.page_size), "kv")
                for i, ok in enumerate(got):
                    if ok:
                        restored += 1
                        page = view[:, 8 + i].reshape(-1)
                        wrong += int(not np.array_equal(page, page_of(keys[i], page_bytes)))
                if all(stored) and all(got):
                    last_ok = time.monotonic()
                    recovered += 1
        finally:
            stop.set()
            thread.join(timeout=130)
    assert kills == 20
    assert wrong == 0 and restored > 0


def recovered_after_last(killed_at: list[float], last_ok: float) -> bool:
    return bool(killed_at) and last_ok > killed_at[-1]
