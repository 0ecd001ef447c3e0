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
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy.backends.peer.server.tiers import SLOT_COST
from tests.backends.peer.peer_helpers import SERVER_SETS, need_ucxx
from tests.support.installs import missing
from tests.support.paths import ROOT, child_env
from tests.support.processes import next_line
from tests.support.waiting import wait_until

DASHBOARD = ROOT / "dashboards" / "kvcr-policy.json"
PROMETHEUS = shutil.which("prometheus")
SCRAPE = "200ms"
# Grafana's variables as the test fills them in: every profile and pool, a window that covers
# the whole run.
VARIABLES = {
    "$__rate_interval": "2m",
    **{f"${name}": ".*" for name in ("job", "instance", "server", "backend", "profile", "pool")},
}
#: Every selector of every query filters by each of these.
FILTERS = ("job", "instance", "backend", "profile", "pool")
#: The panels of peer servers (``kvcr-policy serve``), whose instance is the ``$server``.
SERVER_PANELS = "Server "
#: Gauges of a process's tier: summed only within one process and backend (a peer server's tier
#: and a client's are different tiers, and so are two processes').
LEVELS = (
    "kvcr_policy_tier_capacity_bytes",
    "kvcr_policy_tier_used_bytes",
    "kvcr_policy_claims_outstanding",
    "kvcr_policy_placement_huge_page_bytes",
    "kvcr_policy_placement_numa_pages",
    "kvcr_policy_link_limit_bytes_per_second",
)
SHARE = "Restore speed while restoring, as a share of the link limit"

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
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int, int, int]]:
    """A Prometheus server scraping three ports of 127.0.0.1 in one job: (its API URL, the
    ports for the benchmark, a peer server and this process, its client)."""
    assert PROMETHEUS is not None
    target, peer, client, port = _free_port(), _free_port(), _free_port(), _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE}\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: kvcr-policy\n"
        f"    scrape_interval: {SCRAPE}\n    scrape_timeout: {SCRAPE}\n"
        f"    static_configs:\n      - targets: "
        f"['127.0.0.1:{target}', '127.0.0.1:{peer}', '127.0.0.1:{client}']\n",
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
        yield api, target, peer, client
    finally:
        _stop(server)


def _query(api: str, expr: str, span: tuple[float, float] | None = None) -> list[float]:
    """Every value of ``expr``: at the last moment, or over ``span`` (start, end) every 0.5 s
    as a Grafana panel asks for its time range."""
    expr = _filled(expr)
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


_SELECTOR = re.compile(r"\b(kvcr_policy_[a-z_]+)(\{[^}]*\})?")
_MATCHER = re.compile(r'([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_AGGREGATION = re.compile(r"\b(sum|max|min|avg) by \(([^)]*)\)\s*\(")


def selectors(expr: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """(metric, {label: (operator, value)}) of every selector in ``expr``."""
    found = []
    for match in _SELECTOR.finditer(expr):
        body = (match.group(2) or "{}")[1:-1]
        matchers = {m.group(1): (m.group(2), m.group(3)) for m in _MATCHER.finditer(body)}
        rest = _MATCHER.sub("", body).replace(",", "").strip()
        assert not rest, f"{expr}: cannot read {body!r}"
        found.append((match.group(1), matchers))
    return found


def aggregations(expr: str) -> list[tuple[tuple[str, ...], str]]:
    """(by-labels, the metric aggregated) of every ``op by (...) (...)`` in ``expr``."""
    found = []
    for match in _AGGREGATION.finditer(expr):
        labels = tuple(label.strip() for label in match.group(2).split(","))
        inner = _SELECTOR.search(expr, match.end())
        assert inner is not None, expr
        found.append((labels, inner.group(1)))
    return found


def test_the_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", *FILTERS} <= set(variables)
    for name in ("instance", "backend", "profile", "pool"):  # each narrows to the ones above
        assert 'job=~"$job"' in variables[name]["definition"], name
    found = queries()
    assert len(found) >= 20
    for title, ref, expr in found:
        assert "kvcr_policy_" in expr, title
        assert "[$__rate_interval]" in expr or "rate(" not in expr, (title, ref)
        for metric, matchers in selectors(expr):
            for label in FILTERS:
                wanted = label
                if label == "instance" and title.startswith(SERVER_PANELS):
                    wanted = "server"
                assert matchers.get(label) == ("=~", f"${wanted}"), (title, ref, metric, label)
        for labels, metric in aggregations(expr):
            if metric in LEVELS:  # never summed over processes or backends
                assert {"instance", "backend"} <= set(labels), (title, ref, metric)
    assert 'job=~"$job"' in variables["server"]["definition"]
    served = {title for title, _, _ in found if title.startswith(SERVER_PANELS)}
    for metric in ("served_bytes", "stored_bytes", "hits", "auth_failures", "connections"):
        name = f"kvcr_policy_peer_{metric}"
        assert any(name in expr for title, _, expr in found if title in served), metric
    share = [expr for title, _, expr in found if title == SHARE]
    assert len(share) == 1 and share[0].startswith("clamp_max(") and share[0].endswith(", 1)")
    # Bytes, seconds and the limit of the share are grouped alike: one process's own ratio.
    assert len({labels for labels, _ in aggregations(share[0])}) == 1


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    """promtool (Prometheus's own parser) reads each query, variables filled in."""
    promtool = shutil.which("promtool")
    if promtool is None:
        missing(
            "promtool is not installed: bash .ci/install-tests.sh (or apt-get install prometheus)"
        )
    rules = [
        {"record": f"kvcr:q{i}", "expr": _filled(expr)} for i, (*_, expr) in enumerate(queries())
    ]
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}), "utf-8")
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules)} rules found" in done.stdout


def _filled(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


CLIENT = """
import sys
sys.path.insert(0, {root!r})
from kvcr_policy import build_pipeline, load_config
from kvcr_policy.observability.exposition import serve_metrics
from tests.support.pools import fresh_keys, geometry, pool_buffer, token_indices

exposed = serve_metrics("127.0.0.1:{client}")
overrides = {{"transport.name": "ucx", "transport.options.peer": {address!r}}}
loaded = load_config({profile!r}, overrides=overrides, environ={{}})
geo = geometry(name="kv", pages=8)
# A tier of its own beside (the engine's host cache), audited when it registers: the placement
# panels read it for as long as this process lives, where the benchmark's tiers are gone as
# soon as its run ends, maybe before a scrape saw them.
own = load_config({local!r}, overrides={{"observability.audit_placement": True}}, environ={{}})
with build_pipeline(loaded) as pipeline, build_pipeline(own) as local:
    pipeline.register_pool("kv", geo, pool_buffer(geo))
    local.register_pool("local", geo, pool_buffer(geo))
    print("ready", flush=True)
    sys.stdin.readline()  # the test saw the zeros scraped
    keys = fresh_keys(4)
    assert pipeline.set(keys, token_indices(range(4), geo.page_size)) == [True] * 4
    assert pipeline.exists([*keys, "absent"]) == 4
    assert pipeline.get(keys, token_indices(range(4, 8), geo.page_size)) == [True] * 4
    print("moved", geo.page_bytes, flush=True)
    sys.stdin.readline()  # the test is done with this client
exposed.close()
"""


@contextmanager
def _peer_with_a_client(api: str, port: int, client: int, folder: Path) -> Iterator[int]:
    """``kvcr-policy serve --metrics 127.0.0.1:port`` and a client process (its /metrics on
    ``client``, as an engine's) holding pages in the server's tier (pool ``kv``, as the
    benchmark's): the tier's capacity in bytes. The client runs in a process of its own, so
    its page holds its own series only (this test process's registry holds every series the
    tests before it made, too many to scrape within the 200 ms timeout)."""
    need_ucxx()
    sets = [arg for key, val in SERVER_SETS.items() for arg in ("--set", f"{key}={val}")]
    serve = subprocess.Popen(
        [sys.executable, "-m", "kvcr_policy", "serve", "--listen", "127.0.0.1:0", "--metrics",
         f"127.0.0.1:{port}", *sets, "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(drop=("KVCR_POLICY_",)),
    )  # fmt: skip
    engine: subprocess.Popen[str] | None = None
    try:
        address = json.loads(next_line(serve))["listening"]
        # A profile label of its own, so the queries below read this client's series only.
        profile = folder / f"client{uuid.uuid4().hex[:10]}.toml"
        profile.write_text("", encoding="utf-8")
        local = folder / f"local{uuid.uuid4().hex[:10]}.toml"  # the client's own tier's label
        local.write_text("", encoding="utf-8")
        code = CLIENT.format(
            root=str(ROOT), client=client, address=address, profile=str(profile), local=str(local)
        )
        engine = subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=child_env(drop=("KVCR_POLICY_",)),
        )
        assert next_line(engine) == "ready"
        # A rate needs a sample before the change: Prometheus reads the zeros first.
        zeros = f'kvcr_policy_metadata_keys_queried_total{{profile="{profile.stem}"}}'
        wait_until(lambda: _query(api, zeros) == [0.0], "a scrape of the client", 60)
        # And the server's, whose tier of the pool the client registered counts no claim yet.
        hits = f'kvcr_policy_peer_hits_total{{instance="127.0.0.1:{port}", pool="kv"}}'
        wait_until(lambda: _query(api, hits) == [0.0], "a scrape of the server's zeros", 60)
        assert engine.stdin is not None
        engine.stdin.write("go\n")
        engine.stdin.flush()
        moved, page_bytes = next_line(engine).split()
        assert moved == "moved", moved
        # The server's hit-ratio panel needs its counts after the claims scraped as well.
        wait_until(lambda: sum(_query(api, hits)) > 0, "a scrape of the server's hits", 60)
        yield (256 << 20) // max(int(page_bytes), SLOT_COST) * int(page_bytes)
    finally:
        if engine is not None:
            _stop(engine)
        _stop(serve)


def _series(api: str, expr: str, span: tuple[float, float]) -> list[tuple[dict[str, str], float]]:
    """(labels, largest finite value) of every series of ``expr`` with one over ``span``
    (a ratio of zeros is NaN: a process that restored nothing has no speed)."""
    query = {"query": _filled(expr), "start": span[0], "end": span[1], "step": 0.5}
    reply = _get(f"{api}/api/v1/query_range?" + urllib.parse.urlencode(query))
    assert reply["status"] == "success", (expr, reply)
    found = []
    for series in reply["data"]["result"]:
        values = [float(v) for _, v in series["values"] if math.isfinite(float(v))]
        if values:
            found.append((series["metric"], max(values)))
    return found


def test_every_query_returns_data_from_a_real_bench_run(
    prometheus: tuple[str, int, int, int], tmp_path: Path
) -> None:
    """A benchmark, a peer server and its client scraped in one job: every query returns
    data, tier panels show each process's tier on its own, and the share of the link limit
    stays at or below 1 (before its clamp)."""
    api, port, peer, client = prometheus
    with _peer_with_a_client(api, peer, client, tmp_path) as server_capacity:
        _bench_and_check(api, port, peer, server_capacity)


def _bench_and_check(api: str, port: int, peer: int, server_capacity: int) -> None:
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
        restored = _query(
            api, f'sum(kvcr_policy_bytes_total{{direction="restore", instance="127.0.0.1:{port}"}})'
        )
        assert restored == [result["bytes"] * len(result["runs"])]
        empty = []
        span = (began, time.time())
        for title, ref, expr in queries():
            values = _query(api, expr, span)
            if not any(math.isfinite(v) for v in values):
                empty.append(f"{title} [{ref}]: {expr} -> {values}")
        assert not empty, "queries without data:\n" + "\n".join(empty)
        by_title = {(title, ref): expr for title, ref, expr in queries()}
        capacity = _series(api, by_title[("Tier bytes", "A")], span)
        tiers = {(ls["instance"], ls["backend"], ls["pool"]): value for ls, value in capacity}
        assert len(tiers) == len(capacity), capacity  # each process's tier on its own
        assert tiers[(f"127.0.0.1:{peer}", "peer-server", "kv")] == server_capacity  # not summed
        assert (f"127.0.0.1:{port}", "dram", "kv") in tiers  # the benchmark's own
        for labels, value in _series(api, by_title[("Tier fill", "A")], span):
            assert 0 <= value <= 1, labels
        share = by_title[(SHARE, "A")].removeprefix("clamp_max(").removesuffix(", 1)")
        shares = _series(api, share, span)
        assert shares
        # Prometheus extrapolates the two rates of the ratio over the window alike, up to
        # the share of one scrape interval (200 ms) in the 2 min window that it cuts.
        assert all(value <= 1.01 for _, value in shares), shares
    finally:
        _stop(bench)
