"""Serving /metrics: addresses (loopback unless told otherwise) and the multiprocess folder.

The multiprocess test runs real pipelines in two child processes that write to one
``PROMETHEUS_MULTIPROC_DIR`` (as SGLang's schedulers do) and reads the merged values over HTTP.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvcr_policy.errors import ArgumentError
from kvcr_policy.observability.exposition import check_public, parse_listen, serve_metrics
from tests.observability.scraping import read_samples, value
from tests.support.commands import run_command
from tests.support.paths import child_env
from tests.support.processes import next_line


@pytest.mark.parametrize(
    ("text", "host", "port"),
    [
        ("9480", "127.0.0.1", 9480),
        ("0.0.0.0:9480", "0.0.0.0", 9480),
        ("localhost:1", "localhost", 1),
        ("[::1]:9480", "::1", 9480),
        ("127.0.0.1:0", "127.0.0.1", 0),
    ],
)
def test_listen_addresses(text: str, host: str, port: int) -> None:
    assert parse_listen(text) == (host, port)


@pytest.mark.parametrize("text", ["", "host:", ":9480", "9480x", "1.2.3.4:70000", "a:b:c"])
def test_bad_listen_addresses_say_what_is_expected(text: str) -> None:
    with pytest.raises(ArgumentError, match=r"--metrics: expected PORT, HOST:PORT"):
        parse_listen(text)


@pytest.mark.parametrize("text", ["9480", "127.0.0.1:9", "127.8.0.1:1", "localhost:1", "[::1]:1"])
def test_loopback_needs_no_opt_in(text: str) -> None:
    check_public(text, public=False)


@pytest.mark.parametrize("text", ["0.0.0.0:9480", "[::]:9480", "10.0.0.5:9480", "example.org:1"])
def test_any_other_address_needs_metrics_public(text: str) -> None:
    with pytest.raises(ArgumentError, match=r"observability\.metrics_public = true"):
        check_public(text, public=False)
    check_public(text, public=True)


@pytest.mark.parametrize("command", ["serve", "bench"])
def test_serve_and_bench_refuse_a_public_metrics_address_before_they_start(command: str) -> None:
    done = run_command(command, "--metrics", "0.0.0.0:0", timeout=120)
    assert done.returncode == 2, done.stderr
    assert "--metrics '0.0.0.0:0': 0.0.0.0 is not loopback" in done.stderr
    assert "metrics_public" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_bare_port_serves_loopback_only() -> None:
    server = serve_metrics("0")
    try:
        assert server.host == "127.0.0.1"
        assert server.url.startswith("http://127.0.0.1:")
        assert "python_info" in str(read_samples(server.url))
    finally:
        server.close()
        server.close()  # idempotent


def test_a_port_in_use_is_a_clear_error() -> None:
    server = serve_metrics("127.0.0.1:0")
    try:
        with pytest.raises(ArgumentError, match=f"cannot listen on 127.0.0.1:{server.port}"):
            serve_metrics(f"127.0.0.1:{server.port}")
    finally:
        server.close()


CHILD = textwrap.dedent(
    """
    import sys, numpy as np
    from kvcr_policy import build_pipeline, load_config
    from kvcr_policy.geometry import PoolGeometry
    geometry = PoolGeometry("kv", "layer_first", 3, 2, 8, "float16", 4, 4 * 16)
    loaded = load_config(sys.argv[1], environ={}, overrides={"placement.capacity_bytes": "1MiB"})
    with build_pipeline(loaded) as pipeline:
        pipeline.register_pool("kv", geometry, np.zeros(geometry.shape, dtype=np.float16))
        n = int(sys.argv[2])
        keys = [f"k{i}" for i in range(n)]
        tokens = np.arange(n * 4)
        assert pipeline.set(keys, tokens) == [True] * n
        assert pipeline.get(keys, tokens) == [True] * n
        print("open", flush=True)
        sys.stdin.read()  # hold the tier open until told to stop
    """
)


def test_processes_writing_one_folder_are_merged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "multiproc"
    folder.mkdir()
    profile = tmp_path / "mp-merge.toml"
    profile.write_text("", encoding="utf-8")
    env = child_env({}, PROMETHEUS_MULTIPROC_DIR=str(folder))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(profile), str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in (3, 5)
    ]
    try:
        for child in children:
            assert next_line(child).strip() == "open"
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(folder))
        server = serve_metrics("127.0.0.1:0")
        try:
            s = read_samples(server.url, "mp-merge")
        finally:
            server.close()
    finally:
        for child in children:
            child.communicate("", timeout=60)
    page = 768
    # Counters add up over processes; levels (tier bytes) are summed over live processes.
    assert value(s, "kvcr_policy_bytes_total", direction="restore") == 8 * page
    assert value(s, "kvcr_policy_tier_used_bytes") == 8 * page
    assert value(s, "kvcr_policy_tier_capacity_bytes") == 2 * ((1 << 20) // page) * page
    assert value(s, "kvcr_policy_call_duration_seconds_count", call="get") == 2
