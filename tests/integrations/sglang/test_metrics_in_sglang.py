"""The backend's metrics in SGLang's own /metrics, read through SGLang's real collector code.

SGLang 0.5.23 with ``--enable-metrics`` sets ``PROMETHEUS_MULTIPROC_DIR`` in its main process
(``set_prometheus_multiproc_dir``, sglang/srt/utils/common.py) before it spawns the scheduler
processes, where the HiCache storage backend lives; its HTTP server mounts ``/metrics`` with
``add_prometheus_middleware``, a ``MultiProcessCollector`` over that folder. This test does the
same: a spawned stand-in scheduler (``sglang_scheduler.py``) runs our backend over a real host
pool, then SGLang's middleware serves ``/metrics`` from a real uvicorn server, read over HTTP.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import queue
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.integrations.conftest import TIER
from tests.observability.scraping import read_samples, value
from tests.support.installs import missing
from tests.support.waiting import wait_until

pytestmark = pytest.mark.sglang

MULTIPROC = "PROMETHEUS_MULTIPROC_DIR"


def test_backend_metrics_appear_in_sglangs_metrics(
    sg: SimpleNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if importlib.util.find_spec("uvicorn") is None:
        missing("uvicorn (SGLang's HTTP server) is not installed; run `bash .ci/install-sglang.sh`")
    from sglang.srt.utils.common import set_prometheus_multiproc_dir

    # As SGLang's engine start with --enable-metrics: no folder given, SGLang makes one and
    # exports it before any scheduler starts (monkeypatch restores the variable afterwards).
    monkeypatch.setenv(MULTIPROC, "placeholder")
    monkeypatch.delenv(MULTIPROC)
    set_prometheus_multiproc_dir()
    folder = os.environ[MULTIPROC]
    profile = tmp_path / "sglang-metrics.toml"
    profile.write_text('[coalescing]\nstrategy = "contiguous"\n', encoding="utf-8")

    spawn = multiprocessing.get_context("spawn")
    report, stop = spawn.Queue(), spawn.Event()
    scheduler = spawn.Process(target=_scheduler, args=(str(profile), TIER, report, stop))
    scheduler.start()
    try:
        done = _report(report, scheduler)
        s = _scrape_like_sglang("sglang-metrics")
    finally:
        stop.set()
        scheduler.join(timeout=60)
    assert scheduler.exitcode == 0
    assert done["stored"] == [True] * 10 and done["present"] == 10
    assert done["got"] == [True] * 6 + [False, False]
    assert os.listdir(folder), "the scheduler wrote no metrics into SGLang's folder"
    page = done["page_bytes"]
    assert value(s, "kvcr_policy_bytes_total", direction="store", pool="kv") == 10 * page
    assert value(s, "kvcr_policy_bytes_total", direction="restore", pool="kv") == 6 * page
    assert value(s, "kvcr_policy_misses_total", direction="restore", reason="absent") == 2
    assert value(s, "kvcr_policy_metadata_keys_queried_total") == 11
    assert value(s, "kvcr_policy_metadata_keys_hit_total") == 10
    assert value(s, "kvcr_policy_call_duration_seconds_count", call="get") == 1
    planes = 2 * 3  # K and V of 3 layers, layer_first
    assert value(s, "kvcr_policy_descriptors_before_coalescing_total") == 16 * planes
    assert value(s, "kvcr_policy_descriptors_after_coalescing_total") == 2 * planes
    tier = 64 << 20
    assert value(s, "kvcr_policy_tier_capacity_bytes") == tier // page * page
    assert value(s, "kvcr_policy_tier_used_bytes") == 10 * page
    # Closed with SGLang: the scheduler's tier is taken back from the host's total.
    after = _scrape_like_sglang("sglang-metrics")
    assert value(after, "kvcr_policy_tier_capacity_bytes") == 0
    assert value(after, "kvcr_policy_bytes_total", direction="restore") == 6 * page


def _scrape_like_sglang(profile: str) -> dict:
    """GET /metrics from SGLang's own middleware on a real uvicorn server."""
    import uvicorn
    from sglang.srt.utils.common import add_prometheus_middleware
    from starlette.applications import Starlette

    app = Starlette()
    add_prometheus_middleware(app)  # SGLang's own /metrics: a MultiProcessCollector
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "uvicorn started", 30)
        port = server.servers[0].sockets[0].getsockname()[1]
        return read_samples(f"http://127.0.0.1:{port}/metrics", profile)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _report(report: Any, scheduler: Any) -> dict[str, Any]:
    """What the scheduler reports; fails at once if it died first."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            return dict(report.get(timeout=1))
        except queue.Empty:
            if not scheduler.is_alive():
                pytest.fail(f"the scheduler process died (exit code {scheduler.exitcode})")
    pytest.fail("the scheduler reported nothing within 180 s")


def _scheduler(profile: str, tier: str, report: object, stop: object) -> None:
    from tests.integrations.sglang_scheduler import run

    run(profile, tier, report, stop)
