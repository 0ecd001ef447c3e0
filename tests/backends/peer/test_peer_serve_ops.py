"""``kvcr-policy serve`` for operators: the metrics port's health paths, a flood of half-sent
requests on it that leaves the tier serving, failed logins counted and logged, and the
descriptor limit raised and checked against the tenants' session caps.

Each server runs as a child process under a descriptor limit the test sets (a Python wrapper
calls ``setrlimit`` and then the command line), so what a flood takes is measured against a
known limit. Every wait is bounded (socket and handshake timeouts), none is timed.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy.backends.peer.serve import with_port
from kvcr_policy.errors import AuthenticationError
from tests.backends.peer.peer_helpers import SERVER_SETS, Serve, need_ucxx
from tests.backends.peer.tenants import client_factory, tenants_dir, write_secret
from tests.observability.scraping import read_samples, value
from tests.support.paths import child_env
from tests.support.pools import fresh_keys, geometry, pool_buffer, token_indices
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.ucx]

# serve under RLIMIT_NOFILE (SOFT, HARD) given as its first two arguments.
LIMITED = (
    "import resource, sys\n"
    "soft, hard = int(sys.argv.pop(1)), int(sys.argv.pop(1))\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))\n"
    "from kvcr_policy.cli import main\n"
    "main(sys.argv[1:])\n"
)
HARD = 512
FLOOD = 700  # more than HARD: one descriptor each, under a server with one per connection


def limited(soft: int, hard: int) -> tuple[str, ...]:
    return ("-c", LIMITED, str(soft), str(hard))


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no descriptor limit in /proc/PID/limits")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tenants_dir(tmp_path_factory.mktemp("ops"))


@pytest.fixture(scope="module")
def server(folder: Path) -> Any:
    need_ucxx()
    sets = {
        **SERVER_SETS,
        "security.tenants_dir": str(folder),
        "security.tenant_max_sessions": 8,  # 2 x 8 x 12 + 128 descriptors fit HARD
        "security.idle_timeout_s": 30,
    }
    served = Serve(sets, args=("--metrics", "0"), python=limited(256, HARD))
    yield served
    served.stop()


def test_health_paths(server: Any) -> None:
    base = server.info["metrics"].removesuffix("/metrics")
    assert fetch(base + "/healthz") == (200, "ok\n")
    assert fetch(base + "/readyz") == (200, "ready\n")
    assert fetch(base + "/metrics")[0] == 200
    assert fetch(base + "/nope")[0] == 404
    assert soft_limit(server.proc.pid) == HARD  # raised from 256 at start


def test_half_sent_requests_leave_scrapes_and_logins_working(server: Any, folder: Path) -> None:
    """1,100 half-sent requests once took every descriptor of a server under a 1,024 limit
    (a thread and a descriptor each) and a tenant could not log in until they left."""
    port = int(server.info["metrics"].rsplit(":", 1)[1].split("/")[0])
    held: list[socket.socket] = []
    makers = client_factory(server.address)
    make = next(makers)
    try:
        for _ in range(FLOOD):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
            held.append(sock)
        status, page = fetch(server.info["metrics"])
        assert status == 200 and "kvcr_policy_peer_connections" in page
        geo = geometry(pages=4)
        pipeline = make(folder / "alice")
        pipeline.register_pool("kv", geo, pool_buffer(geo, 3))
        keys = fresh_keys(4)
        assert pipeline.set(keys, token_indices(range(4), geo.page_size)) == [True] * 4
        assert pipeline.exists(keys) == 4
    finally:
        for sock in held:
            sock.close()
        next(makers, None)


def test_bytes_served_and_stored_hits_and_misses_are_counted(server: Any, folder: Path) -> None:
    geo = geometry(pages=8)
    before = read_samples(server.info["metrics"])
    makers = client_factory(server.address)
    make = next(makers)
    try:
        pipeline = make(folder / "bob")
        pipeline.register_pool("kv", geo, pool_buffer(geo, 5))
        keys = fresh_keys(4)
        assert pipeline.set(keys, token_indices(range(4), geo.page_size)) == [True] * 4
        assert pipeline.get(keys[:3], token_indices(range(4, 7), geo.page_size)) == [True] * 3
        assert pipeline.get(fresh_keys(2), token_indices(range(2), geo.page_size)) == [False] * 2
    finally:
        next(makers, None)
    after = read_samples(server.info["metrics"])

    def grew(name: str) -> float:
        labels = {"backend": "peer-server"}
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("kvcr_policy_peer_stored_bytes_total") == 4 * geo.page_bytes
    assert grew("kvcr_policy_peer_served_bytes_total") == 3 * geo.page_bytes
    assert grew("kvcr_policy_peer_hits_total") == 3
    assert grew("kvcr_policy_peer_misses_total") >= 1  # the leading miss ends the claim


def test_a_wrong_secret_is_a_counted_logged_failure(server: Any, tmp_path: Path) -> None:
    geo = geometry(pages=2)
    before = read_samples(server.info["metrics"])
    name = "kvcr_policy_peer_auth_failures_total"
    makers = client_factory(server.address)
    make = next(makers)
    try:
        with pytest.raises(AuthenticationError):
            make(write_secret(tmp_path / "stale")).register_pool("kv", geo, pool_buffer(geo))
    finally:
        next(makers, None)
    after = read_samples(server.info["metrics"])
    grew = value(after, name, reason="wrong_secret") - value(before, name, reason="wrong_secret")
    assert grew >= 1  # the client may retry its handshake once
    wait_until(
        lambda: any("failed authentication" in line and "client 127.0.0.1:" in line
                    and "secret this server does not" in line for line in server.log),
        "the server to log the failure with the client's address",
        30,
    )  # fmt: skip


def test_session_caps_that_cannot_fit_the_limit_are_refused(folder: Path) -> None:
    """Two tenants at the default cap (64 sessions of 12 descriptors) need 1,664."""
    need_ucxx()
    command = [sys.executable, *limited(1024, 1024), "serve", "--listen", "127.0.0.1:0",
               "--set", f"security.tenants_dir={folder}"]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=child_env(drop=("KVCR_",))
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    err = done.stderr
    assert "security.tenant_max_sessions (from default)" in err, err
    assert "2 tenants x 64 sessions x 12 descriptors" in err and "got 1024" in err, err
    assert "--set security.tenant_max_sessions=37" in err and "ulimit -Hn" in err, err


@pytest.mark.parametrize(
    ("given", "listen"),
    [
        (None, None),
        ("127.0.0.1", "127.0.0.1:7480"),
        ("localhost", "localhost:7480"),
        ("[::1]", "[::1]:7480"),
        ("127.0.0.1:0", "127.0.0.1:0"),
        ("[::1]:9", "[::1]:9"),
        ("unix:/tmp/x.sock", "unix:/tmp/x.sock"),
    ],
)
def test_a_host_alone_listens_on_the_default_data_port(given: str | None, listen: str) -> None:
    assert with_port(given) == listen


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kvcr_policy", "serve", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=child_env(drop=("KVCR_",))
    )


@pytest.mark.parametrize("flag", ["--metrics", "--listen"])
def test_a_busy_port_is_a_clear_error_before_anything_serves(flag: str) -> None:
    need_ucxx()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        busy = f"127.0.0.1:{holder.getsockname()[1]}"
        args = [flag, busy] + (["--listen", "127.0.0.1:0"] if flag == "--metrics" else [])
        done = _serve(*args)
    assert done.returncode != 0 and done.stdout == "", done.stdout
    assert f"cannot listen on {busy}" in done.stderr and "Traceback" not in done.stderr
    assert "another process holds it" in done.stderr, done.stderr


def test_a_peer_that_is_down_logs_a_warning_once_not_per_call(
    folder: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """35 calls to a stopped server once logged 35 warnings; now each kind is logged once per
    interval (an hour here, so a slow host cannot turn it into two)."""
    import kvcr_policy.backends.peer.client.connection as connection
    import kvcr_policy.backends.peer.client.pool as pool

    for module in (pool, connection):
        monkeypatch.setattr(module._repeats, "interval_s", 3600.0)
        monkeypatch.setattr(module._repeats, "_kinds", type(module._repeats._kinds)())
    sets = {**SERVER_SETS, "security.tenants_dir": str(folder)}
    served = Serve(sets)
    makers = client_factory(served.address)
    make = next(makers)
    calls = 12
    try:
        geo = geometry(pages=4)
        pipeline = make(folder / "alice", transport__op_timeout_s=3)
        pipeline.register_pool("kv", geo, pool_buffer(geo))
        monkeypatch.setattr(pipeline._mover.repeats, "interval_s", 3600.0)  # this pipeline's
        assert pipeline.set(fresh_keys(2), token_indices(range(2), geo.page_size)) == [True] * 2
        served.proc.kill()
        served.proc.wait(timeout=30)
        with caplog.at_level(logging.WARNING, "kvcr_policy"):
            for _ in range(calls):
                keys = fresh_keys(2)
                assert pipeline.set(keys, token_indices(range(2), geo.page_size)) == [False] * 2
    finally:
        next(makers, None)
        served.stop()
    templates = [r.msg for r in caplog.records if r.levelno >= logging.WARNING]
    assert templates, "the first failure is logged"
    assert len(templates) == len(set(templates)) < calls, templates


def test_log_format_json_writes_one_object_per_line(folder: Path) -> None:
    need_ucxx()
    served = Serve({**SERVER_SETS, "security.tenants_dir": str(folder)},
                   args=("--log-format", "json"))  # fmt: skip
    try:
        wait_until(
            lambda: any('"peer listening on' in line or "kvcr-policy peer listening" in line
                        for line in served.log),
            "the server to log where it listens",
            30,
        )  # fmt: skip
    finally:
        served.stop()
    ours = [json.loads(line) for line in served.log if line.startswith('{"time"')]
    listening = [d for d in ours if d["message"].startswith("kvcr-policy peer listening on")]
    assert listening and listening[0]["level"] == "info", served.log
    assert all(d["logger"].startswith("kvcr_policy") for d in ours)
    assert not [line for line in served.log if " kvcr_policy." in line and " INFO " in line]


def test_a_bad_log_level_is_a_clear_error() -> None:
    done = _serve("--log-level", "loud", "--listen", "127.0.0.1:0")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "--log-level: expected one of debug, info" in done.stderr
