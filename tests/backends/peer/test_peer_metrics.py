"""``kvcr-policy serve --metrics``: the peer server's connections, requests, rejected frames and
tier gauges, read over HTTP while a real client moves pages over UCX."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from kvcr_policy.backends.peer.server.tiers import SLOT_COST
from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.backends.peer.wire.framing import HEADER, MAGIC, VERSION
from tests.backends.peer.peer_helpers import SERVER_SETS, need_ucxx
from tests.observability.scraping import Samples, read_samples, value
from tests.support.paths import child_env
from tests.support.pools import fresh_keys, geometry, pool_buffer, token_indices
from tests.support.processes import next_line

pytestmark = pytest.mark.ucx

PROFILE = "peer-metrics"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A ``serve --metrics`` process with its own profile label; its JSON line."""
    need_ucxx()
    profile = tmp_path_factory.mktemp("peer") / f"{PROFILE}.toml"
    profile.write_text("", encoding="utf-8")
    sets = [arg for key, val in SERVER_SETS.items() for arg in ("--set", f"{key}={val}")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcr_policy", "serve", "--listen", "127.0.0.1:0", "--metrics",
         "0", "--profile", str(profile), *sets, "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(drop=("KVCR_POLICY_",)),
    )  # fmt: skip
    try:
        line = json.loads(next_line(proc))
        yield line
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def metrics_url() -> Iterator[str]:
    """/metrics of this process's default registry (the client pipelines' metrics)."""
    from kvcr_policy.observability.exposition import serve_metrics

    server = serve_metrics("127.0.0.1:0")
    yield server.url
    server.close()


def _scrape(served: dict[str, Any]) -> Samples:
    return read_samples(served["metrics"], PROFILE)


def test_the_metrics_address_is_loopback_and_printed(served: dict[str, Any]) -> None:
    assert served["metrics"].startswith("http://127.0.0.1:")
    s = _scrape(served)
    assert value(s, "kvcr_policy_peer_connections") == 0
    assert value(s, "kvcr_policy_peer_requests_total", kind="claim") == 0  # created up front


def test_requests_connections_and_tier_while_a_client_works(served: dict[str, Any]) -> None:
    from kvcr_policy import build_pipeline, load_config

    overrides = {
        "transport.name": "ucx",
        "transport.options.peer": served["listening"],
        "observability.metrics": False,
    }
    geo = geometry(name="kv", pages=8)
    with build_pipeline(load_config(overrides=overrides, environ={})) as pipeline:
        pipeline.register_pool("kv", geo, pool_buffer(geo))
        keys = fresh_keys(6)
        assert pipeline.set(keys, token_indices(range(6), geo.page_size)) == [True] * 6
        assert pipeline.exists(keys) == 6
        assert pipeline.get(keys, token_indices(range(6), geo.page_size)) == [True] * 6
        s = _scrape(served)
        assert value(s, "kvcr_policy_peer_connections") == 1
        for kind in ("hello", "attach", "exists", "claim", "reserve"):
            assert value(s, "kvcr_policy_peer_requests_total", kind=kind) >= 1, kind
        page = geo.page_bytes
        slots = (256 << 20) // max(page, SLOT_COST)  # a small page counts as SLOT_COST
        labels = {"backend": "peer-server", "pool": "kv"}
        assert value(s, "kvcr_policy_tier_capacity_bytes", **labels) == slots * page
        assert value(s, "kvcr_policy_tier_used_bytes", **labels) >= 6 * page
    assert value(_scrape(served), "kvcr_policy_peer_connections") == 0


def _send(address: str, data: bytes) -> None:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.settimeout(3)
        sock.sendall(data)
        try:
            while sock.recv(65536):  # until the server closes the connection
                pass
        except (TimeoutError, ConnectionResetError):
            pass


def test_rejected_frames_by_reason(served: dict[str, Any]) -> None:
    before = _scrape(served)
    _send(served["listening"], HEADER.pack(MAGIC, VERSION + 7, int(m.Kind.HELLO), 0, 1))
    _send(served["listening"], m.encode(m.Exists(0, ["a"]), 1))  # a request before HELLO
    after = _scrape(served)
    for reason in ("malformed", "unexpected"):
        name = "kvcr_policy_peer_rejected_frames_total"
        grew = value(after, name, reason=reason) - value(before, name, reason=reason)
        assert grew == 1, reason


def test_a_peer_gone_is_backend_unavailable(tmp_path: Any, metrics_url: str) -> None:
    """The client's own metrics: after the server is killed, its pages miss as
    ``backend_unavailable`` (connection ended), not as a generic transport error."""
    from kvcr_policy import build_pipeline, load_config

    sets = [arg for key, val in SERVER_SETS.items() for arg in ("--set", f"{key}={val}")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcr_policy", "serve", "--listen", "127.0.0.1:0", *sets,
         "--log-level", "error"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(),
    )  # fmt: skip
    try:
        address = json.loads(next_line(proc))["listening"]
        profile = tmp_path / "peer-gone.toml"
        profile.write_text('[fallback]\nstrategy = "miss"\n', encoding="utf-8")
        overrides = {
            "transport.name": "ucx",
            "transport.options.peer": address,
            "transport.op_timeout_s": 3,
        }
        geo = geometry(name="kv", pages=8)
        with build_pipeline(load_config(profile, overrides=overrides, environ={})) as pipeline:
            pipeline.register_pool("kv", geo, pool_buffer(geo))
            keys = fresh_keys(4)
            assert pipeline.set(keys, token_indices(range(4), geo.page_size)) == [True] * 4
            proc.kill()
            proc.wait(timeout=30)
            assert (
                pipeline.set(fresh_keys(3), token_indices(range(4, 7), geo.page_size))
                == [False] * 3
            )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    s = read_samples(metrics_url, "peer-gone")
    assert (
        value(s, "kvcr_policy_misses_total", direction="store", reason="backend_unavailable") == 3
    )
    assert value(s, "kvcr_policy_misses_total", reason="transport_error") == 0
