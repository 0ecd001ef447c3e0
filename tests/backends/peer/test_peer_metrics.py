"""``kvcr-policy serve --metrics``: the peer server's connections, requests, rejected frames and
tier gauges, read over HTTP while a real client moves pages over UCX."""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kvcr_policy.backends.peer.server.tiers import SLOT_COST
from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.backends.peer.wire.framing import HEADER, MAGIC, VERSION
from kvcr_policy.cli.help import package_version
from tests.backends.peer.peer_helpers import SERVER_SETS, need_ucxx
from tests.backends.peer.raw_client import Raw, default_secret
from tests.observability.scraping import Samples, read_samples, value
from tests.support.paths import child_env
from tests.support.pools import fresh_keys, geometry, pool_buffer, token_indices
from tests.support.processes import next_line
from tests.support.waiting import wait_until

pytestmark = pytest.mark.ucx

PROFILE = "peer-metrics"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A ``serve --metrics --format json`` process with its own profile label; its JSON line
    (the report ``serve`` prints, JSON with or without ``--format json``)."""
    need_ucxx()
    profile = tmp_path_factory.mktemp("peer") / f"{PROFILE}.toml"
    profile.write_text("", encoding="utf-8")
    sets = [arg for key, val in SERVER_SETS.items() for arg in ("--set", f"{key}={val}")]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcr_policy", "serve", "--listen", "127.0.0.1:0", "--metrics",
         "0", "--profile", str(profile), *sets, "--log-level", "warning", "--format", "json"],
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


def test_build_info_and_no_created_series(served: dict[str, Any]) -> None:
    with urllib.request.urlopen(served["metrics"], timeout=10) as reply:
        page = reply.read().decode()
    assert "_created" not in page
    info = {ls: v for (name, ls), v in read_samples(served["metrics"]).items()
            if name == "kvcr_policy_build_info"}  # fmt: skip
    assert list(info.values()) == [1.0]
    labels = dict(next(iter(info)))
    assert labels == {"version": package_version(), "python": platform.python_version()}


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
    # The server sees the close when its loop next runs, not by the time close() returns.
    wait_until(
        lambda: value(_scrape(served), "kvcr_policy_peer_connections") == 0,
        "the server to count the closed connection out",
        30,
        every=0.05,
    )


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


TIER = {"backend": "peer-server", "pool": "kv"}


def _claims(served: dict[str, Any]) -> float:
    s = _scrape(served)
    assert ("kvcr_policy_claims_outstanding", tuple(sorted(TIER.items()))) in s  # exported
    return value(s, "kvcr_policy_claims_outstanding", **TIER)


def _client(served: dict[str, Any]) -> Any:
    from kvcr_policy import build_pipeline, load_config

    overrides = {
        "transport.name": "ucx",
        "transport.options.peer": served["listening"],
        "observability.metrics": False,
    }
    return build_pipeline(load_config(overrides=overrides, environ={}))


def test_clean_client_runs_leave_no_claim_on_the_server(served: dict[str, Any]) -> None:
    """Reads release their claims when their sends complete: a scrape after each run (once the
    server has seen the completion) and after the clients are gone shows 0 claimed pages and
    the bytes the tier holds."""
    geo = geometry(name="kv", pages=8)
    used = value(_scrape(served), "kvcr_policy_tier_used_bytes", **TIER)
    for run in range(3):
        with _client(served) as pipeline:
            pipeline.register_pool("kv", geo, pool_buffer(geo))
            keys = fresh_keys(4)
            assert pipeline.set(keys, token_indices(range(4), geo.page_size)) == [True] * 4
            assert pipeline.get(keys, token_indices(range(4, 8), geo.page_size)) == [True] * 4
            # The SEND's completion releases them, seen by the server after the client has
            # its bytes (a starved server thread may see it later): wait for it, bounded.
            wait_until(lambda: _claims(served) == 0, f"run {run}: claims released", 60)
            used += 4 * geo.page_bytes
            assert value(_scrape(served), "kvcr_policy_tier_used_bytes", **TIER) == used
            assert pipeline.delete(keys[:1]) == 1  # a DELETE names a pool: it was refreshed
            used -= geo.page_bytes
    wait_until(lambda: value(_scrape(served), "kvcr_policy_peer_connections") == 0, "gone", 30)
    s = _scrape(served)
    assert value(s, "kvcr_policy_claims_outstanding", **TIER) == 0
    assert value(s, "kvcr_policy_tier_used_bytes", **TIER) == used


def test_claims_follow_grant_release_session_end_and_expiry(
    served: dict[str, Any], worker: Any
) -> None:
    """A raw client holds claims without reading them: the server's gauge follows each
    change (granted, released by RELEASE, by the session's end, by expiry) with no request
    naming the tier in between."""
    geo = geometry(name="kv", pages=8)
    with _client(served) as pipeline:
        pipeline.register_pool("kv", geo, pool_buffer(geo))
        keys = fresh_keys(3)
        assert pipeline.set(keys, token_indices(range(3), geo.page_size)) == [True] * 3
    attach = m.Attach(geo.name, geo.layout, geo.layers, geo.heads, geo.head_dim, geo.dtype,
                      geo.page_size, geo.tokens, geo.mla, 0)  # fmt: skip
    pages = np.arange(3, dtype=np.int64)

    def claim(raw: Raw, pool: int) -> int:
        claimed = raw.ask(m.Claim(pool, keys, pages))
        assert isinstance(claimed, m.Claimed) and len(claimed.slots) == 3, claimed
        return int(claimed.claim)

    with Raw(served["listening"], timeout=30) as raw:
        assert isinstance(raw.handshake(default_secret(), worker.address), m.Welcome)
        attached = raw.ask(attach)
        assert isinstance(attached, m.Attached), attached
        handle = claim(raw, attached.pool)
        assert _claims(served) == 3  # granted
        raw.send(m.Release(handle))
        wait_until(lambda: _claims(served) == 0, "claims released by RELEASE", 30)
        claim(raw, attached.pool)
        claim(raw, attached.pool)
        assert _claims(served) == 3  # two claims of the same slots: 3 pages claimed
    wait_until(lambda: _claims(served) == 0, "claims released at the session's end", 30)
    with Raw(served["listening"], timeout=30) as raw:
        assert isinstance(raw.handshake(default_secret(), worker.address), m.Welcome)
        attached = raw.ask(attach)
        assert isinstance(attached, m.Attached), attached
        claim(raw, attached.pool)
        assert _claims(served) == 3
        # transport.op_timeout_s (10 s) passes with no SEND: the claim expires
        wait_until(lambda: _claims(served) == 0, "a claim expired", 60, every=0.5)
