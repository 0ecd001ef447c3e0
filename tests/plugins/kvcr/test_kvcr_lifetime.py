"""Lifetime of the ``kvcr`` backend: close waits for every KVCR operation, gives every claim back,
closes KVCR, and only then frees the region; a KVCR that dies mid-restore gives misses, never
wrong bytes; a process killed mid-restore leaves no listener, file lock or region behind."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy.errors import ClosedError, TransportError
from tests.plugins.kvcr.kvcr_helpers import kvcr_of, pool_tier, stored
from tests.support.paths import child_env
from tests.support.pools import P, pages_of, token_indices
from tests.support.processes import wait_for_line
from tests.support.waiting import wait_until

CHILD = Path(__file__).with_name("kvcr_child.py")


def _handles(kvcr: Any) -> tuple[list[int], list[int]]:
    """Every release handle KVCR's fetch hands out, and every handle given back."""
    fetched: list[int] = []
    released: list[int] = []
    fetch, release, poll = kvcr.fetch, kvcr.release, kvcr.poll_completed

    def poll_completed() -> Any:
        done = list(poll())
        for _, entries in done:
            fetched.extend(int(e.release_handle) for e in entries.values() if e.release_handle)
        return done

    def release_(handles: Any) -> Any:
        released.extend(int(h) for h in handles)
        return release(handles)

    kvcr.fetch, kvcr.release, kvcr.poll_completed = fetch, release_, poll_completed
    return fetched, released


def test_close_during_restores_waits_then_releases_everything(kvcr_pipeline: Any) -> None:
    pipeline = kvcr_pipeline(batching__read_batch_pages=1)
    geo, buffer, keys = stored(pipeline, n=12)
    pool = pool_tier(pipeline)
    fetched, released = _handles(kvcr_of(pipeline))
    view = pages_of(buffer, geo)
    expected = view[:, :12].copy()
    started = threading.Barrier(3)
    results: list[Any] = []
    spans: list[tuple[float, float]] = []  # (start, end) of each restore that returned

    def restore(first: int) -> None:
        started.wait()
        while True:
            start = time.monotonic()
            try:
                got = pipeline.get(keys, token_indices(range(first, first + 12), P))
            except ClosedError:
                return
            spans.append((start, time.monotonic()))
            results.append((first, got, view[:, first : first + 12].copy()))

    workers = [threading.Thread(target=restore, args=(first,)) for first in (20, 34)]
    for worker in workers:
        worker.start()
    started.wait()
    # Evidence that a restore is in flight: KVCR has handed out a claim not yet given back.
    wait_until(
        lambda: pool.runner.claims > 0,
        "a KVCR claim outstanding",
        pipeline.config.transport.op_timeout_s,
        every=0.001,
    )
    closing = time.monotonic()
    pipeline.close()
    closed = time.monotonic()
    for worker in workers:
        worker.join(30)
    # close() waited for a restore that was under way when it was called.
    assert any(start < closing and closing < end <= closed for start, end in spans), spans
    assert results and all(got == [True] * 12 for _, got, _ in results)
    assert all(np.array_equal(pages, expected) for _, _, pages in results)
    assert sorted(fetched) == sorted(released)  # every claim KVCR gave went back
    assert pool.runner.claims == 0 and pool.runner.quiescent is True
    audit = pool.audit()  # the region's own audit (Pipeline.audit() refuses after close)
    assert audit["state"] == "closed" and not audit["leaked"]
    with pytest.raises(ClosedError):
        pipeline.get(keys, token_indices(range(20, 32), P))


def test_a_kvcr_that_dies_mid_restore_gives_misses_never_wrong_bytes(
    kvcr_pipeline: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvcr.progress import _KVCRProgress

    pipeline = kvcr_pipeline(batching__read_batch_pages=2, batching__window_batches=1)
    geo, buffer, keys = stored(pipeline, n=12)
    view = pages_of(buffer, geo)
    expected = view[:, :12].copy()
    view[:, 20:32] = 0
    dead = threading.Event()
    original = _KVCRProgress._run_one_iteration

    def iteration(self: Any) -> bool:
        if dead.is_set():
            raise RuntimeError("injected: the KVCR progress thread died")
        return bool(original(self))

    monkeypatch.setattr(_KVCRProgress, "_run_one_iteration", iteration)
    got = pipeline.get(keys, token_indices(range(20, 32), P), on_ready=lambda n: dead.set())
    lead = got.index(False)
    assert 2 <= lead < 12 and got == [True] * lead + [False] * (12 - lead)
    assert np.array_equal(view[:, 20 : 20 + lead], expected[:, :lead])
    with pytest.raises(TransportError, match="failed"):  # fails fast from now on
        pipeline.exists(keys)
    pool = pool_tier(pipeline)
    pipeline.close()
    audit = pool.audit()  # the region's own audit (Pipeline.audit() refuses after close)
    # Freed only once KVCR said nothing native is left; kept (and reported) otherwise.
    assert audit["state"] == "closed" and audit["leaked"] is (not pool.runner.quiescent)
    assert pool.runner.quiescent is True


def test_a_kvcr_that_dies_with_nothing_pending_fails_fast_from_the_next_call(
    kvcr_pipeline: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KVCR's progress thread dies after a restore's claims and before its first delivery, so
    nothing is pending and the polling thread sleeps: KVCR refuses the delivery, the pages
    miss and nothing is written, and the runner records the failure, so the next call fails
    fast instead of answering from a dead KVCR's metadata."""
    from kvcr.progress import _KVCRProgress

    pipeline = kvcr_pipeline(batching__read_batch_pages=64)
    geo, buffer, keys = stored(pipeline, n=4)
    view = pages_of(buffer, geo)
    view[:, 20:24] = 7
    before = view[:, 20:24].copy()
    kvcr = kvcr_of(pipeline)
    runner = pool_tier(pipeline).runner
    dead = threading.Event()
    original = _KVCRProgress._run_one_iteration

    def iteration(self: Any) -> bool:
        if dead.is_set():
            raise RuntimeError("injected: the KVCR progress thread died")
        return bool(original(self))

    def kvcr_failed() -> bool:
        try:
            kvcr.get_stats()
        except RuntimeError:
            return True
        return False

    deliver = kvcr.deliver

    def deliver_after_death(*args: Any) -> Any:
        dead.set()
        wait_until(kvcr_failed, "KVCR's progress thread dying", 60)
        assert not runner._pending  # nothing pending: the poller cannot know (stats() would wait)
        return deliver(*args)

    monkeypatch.setattr(_KVCRProgress, "_run_one_iteration", iteration)
    kvcr.deliver = deliver_after_death
    assert pipeline.get(keys, token_indices(range(20, 24), P)) == [False] * 4
    assert np.array_equal(view[:, 20:24], before)  # nothing written by a refused delivery
    assert runner.stats()["failed"] is not None
    with pytest.raises(TransportError, match="failed"):
        pipeline.exists(keys)
    pipeline.close()


def _child(port: int, folder: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(port), str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(drop=("KVCR_POLICY_",)),
    )


@pytest.mark.slow
def test_a_process_killed_mid_restore_leaves_nothing_behind(
    kvcr_pipeline: Any, tmp_path: Path
) -> None:
    from kvcr_policy_kvcr.process import free_port, port_free

    from tests.plugins.kvcr.kvcr_child import GEOMETRY

    port = free_port()
    child = _child(port, tmp_path)
    try:
        wait_for_line(child, "ready")
        wait_for_line(child, "restoring")
        wait_for_line(child, "restoring")  # the second restore is under way
        assert not port_free(port)  # KVCR's listener is up
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        child.kill()
    assert port_free(port)
    # The same listen port and the same G3 files (KVCR locks them) serve a new runner at once.
    pipeline = kvcr_pipeline(
        backend__options__listen_port=port,
        backend__options__g3_paths=[str(tmp_path / "g3")],
        backend__options__g3_capacity_bytes_per_file=64 * GEOMETRY.page_bytes,
        placement__capacity_bytes=64 * GEOMETRY.page_bytes,
    )
    buffer = np.zeros(GEOMETRY.nbytes, dtype=np.uint8).view(np.float16).reshape(GEOMETRY.shape)
    pipeline.register_pool("kv", GEOMETRY, buffer)
    assert pipeline.set(["after"], token_indices([0], P)) == [True]
    assert pipeline.exists(["after", "child-0"]) == 1  # a fresh tier: nothing of the child's


@pytest.mark.slow
def test_a_terminated_process_closes_in_order(tmp_path: Path) -> None:
    from kvcr_policy_kvcr.process import free_port

    child = _child(free_port(), tmp_path)
    try:
        wait_for_line(child, "ready")
        wait_for_line(child, "restoring")
        child.send_signal(signal.SIGTERM)
        assert child.stdout is not None
        last = [line for line in child.stdout if line.startswith("{")]
        assert child.wait(60) == 0
    finally:
        child.kill()
    state = json.loads(last[-1])
    assert state == {"claims": 0, "quiescent": True, "region": "closed", "leaked": False}
