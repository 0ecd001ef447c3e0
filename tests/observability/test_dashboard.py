"""The Grafana dashboard against a real Prometheus that scraped a real benchmark run.

A Prometheus server (Debian's ``prometheus`` package; ``.ci/run`` installs it) scrapes
``kvcr-policy bench --metrics`` every 200 ms while the benchmark stores and restores pages;
then every query of ``dashboards/kvcr-policy.json`` is evaluated through Prometheus's HTTP API
with Grafana's variables filled in, and each must return data (a finite value). The run is
small: the ``small`` geometry, 2048 tokens, one repeat.
"""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.installs import missing
from tests.support.paths import ROOT
from tests.support.waiting import wait_until

DASHBOARD = ROOT / "dashboards" / "kvcr-policy.json"
PROMETHEUS = shutil.which("prometheus")
SCRAPE = "200ms"
# Grafana's variables as the test fills them in: every profile and pool, a window that covers
# the whole run.
VARIABLES = {"$__rate_interval": "2m", "$profile": ".*", "$pool": ".*"}

pytestmark = [pytest.mark.slow]


@pytest.fixture(autouse=True)
def _prometheus_installed() -> None:
    if PROMETHEUS is None:
        missing(
            "prometheus is not installed: bash .ci/install-tests.sh (or apt-get install prometheus)"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read().decode())


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def queries() -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["refId"], target["expr"]))
    return found


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A Prometheus server scraping 127.0.0.1:<port>: (its API URL, the port to serve on)."""
    assert PROMETHEUS is not None
    target, port = _free_port(), _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE}\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: kvcr-policy\n"
        f"    scrape_interval: {SCRAPE}\n    scrape_timeout: {SCRAPE}\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{target}']\n",
        encoding="utf-8",
    )
    server = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    api = f"http://127.0.0.1:{port}"
    try:
        ready = f"{api}/-/ready"
        wait_until(
            lambda: urllib.request.urlopen(ready, timeout=2).status == 200,
            "prometheus ready",
            60,
            every=0.1,
            ignore=(OSError,),
        )
        # Prometheus hands new targets to its scrapers a few seconds after it is ready: start
        # the workload only once the target is being scraped (down, until something serves).
        wait_until(
            lambda: _query(api, 'up{job="kvcr-policy"}') != [],
            "the first scrape",
            60,
            every=0.1,
            ignore=(OSError,),
        )
        yield api, target
    finally:
        _stop(server)


def _query(api: str, expr: str, span: tuple[float, float] | None = None) -> list[float]:
    """Every value of ``expr``: at the last moment, or over ``span`` (start, end) every 0.5 s
    as a Grafana panel asks for its time range."""
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    if span is None:
        url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    else:
        start, end = span
        query = {"query": expr, "start": start, "end": end, "step": 0.5}
        url = f"{api}/api/v1/query_range?" + urllib.parse.urlencode(query)
    reply = _get(url)
    assert reply["status"] == "success", (expr, reply)
    values = []
    for series in reply["data"]["result"]:
        points = series["values"] if "values" in series else [series["value"]]
        values.extend(float(v) for _, v in points)
    return values


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    names = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "profile", "pool"} <= names
    found = queries()
    assert len(found) >= 20
    for title, ref, expr in found:
        assert "kvcr_policy_" in expr, title
        assert "[$__rate_interval]" in expr or "rate(" not in expr, (title, ref)


def test_every_query_returns_data_from_a_real_bench_run(prometheus: tuple[str, int]) -> None:
    api, port = prometheus
    began = time.time()
    bench = subprocess.Popen(
        [sys.executable, "-m", "kvcr_policy", "bench", "--geometry", "small", "--tokens", "2048",
         "--repeat", "1", "--metrics", f"127.0.0.1:{port}", "--metrics-hold", "120",
         "--format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert bench.stdout is not None
        lines = []
        for line in bench.stdout:  # the JSON result, printed before /metrics is held up
            lines.append(line)
            if line.rstrip() == "}":
                break
        result = json.loads("".join(lines))
        time.sleep(1.0)  # a few more scrapes of the final values
        restored = _query(api, 'sum(kvcr_policy_bytes_total{direction="restore"})')
        assert restored == [result["bytes"] * len(result["runs"])]
        empty = []
        span = (began, time.time())
        for title, ref, expr in queries():
            values = _query(api, expr, span)
            if not any(math.isfinite(v) for v in values):
                empty.append(f"{title} [{ref}]: {expr} -> {values}")
        assert not empty, "queries without data:\n" + "\n".join(empty)
    finally:
        _stop(bench)
