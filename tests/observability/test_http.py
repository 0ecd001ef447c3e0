"""The bounded metrics endpoint: its paths, and that no number of half-sent requests from a
local user stops it answering or grows its threads and descriptors without bound.

Real sockets over loopback; no timing assertions: every wait is bounded by a socket timeout
that a stuck endpoint cannot pass.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter

from kvcr_policy.errors import ArgumentError
from kvcr_policy.observability import http
from kvcr_policy.observability.exposition import MetricsServer, serve_metrics

FLOOD = 300  # past MAX_CONNECTIONS many times over, under the test process's own limit


@pytest.fixture
def endpoint() -> Iterator[MetricsServer]:
    registry = CollectorRegistry()
    Counter("probe_things", "A counter to find on the page.", registry=registry).inc(3)
    ready = threading.Event()
    server = serve_metrics("127.0.0.1:0", registry, ready=ready.is_set)
    server.ready_flag = ready  # type: ignore[attr-defined]
    yield server
    server.close()
    server.close()  # idempotent


def get(server: MetricsServer, path: str, method: str = "GET") -> tuple[int, str]:
    url = f"http://127.0.0.1:{server.port}{path}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_paths(endpoint: MetricsServer) -> None:
    status, body = get(endpoint, "/metrics")
    assert status == 200 and "probe_things_total 3.0" in body
    assert get(endpoint, "/healthz") == (200, "ok\n")
    assert get(endpoint, "/readyz")[0] == 503  # live, not ready yet
    endpoint.ready_flag.set()  # type: ignore[attr-defined]
    assert get(endpoint, "/readyz") == (200, "ready\n")
    assert get(endpoint, "/metrics?name[]=x")[0] == 200
    for path in ("/", "/metricsx", "/favicon.ico", "/../etc/passwd"):
        assert get(endpoint, path)[0] == 404, path
    assert get(endpoint, "/metrics", method="POST")[0] == 405
    assert get(endpoint, "/healthz", method="HEAD") == (200, "")


def test_a_busy_port_is_a_clear_error(endpoint: MetricsServer) -> None:
    with pytest.raises(ArgumentError, match=rf"cannot listen on 127.0.0.1:{endpoint.port}: .*"
                       r"expected a free port"):  # fmt: skip
        serve_metrics(f"127.0.0.1:{endpoint.port}")


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_half_sent_requests_neither_stop_it_nor_grow_it(endpoint: MetricsServer) -> None:
    """prometheus-client's server gave each of these a thread and a descriptor until the client
    left; here the oldest are dropped past the cap, and a scrape that comes after is served."""
    threads = threading.active_count()
    before = _descriptors()
    held: list[socket.socket] = []
    try:
        for _ in range(FLOOD):
            sock = socket.create_connection(("127.0.0.1", endpoint.port), timeout=30)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never ends its head
            held.append(sock)
        status, body = get(endpoint, "/metrics")  # urlopen's timeout bounds this wait
        assert status == 200 and "probe_things_total" in body
        assert get(endpoint, "/healthz")[0] == 200
        # The endpoint's own descriptors: ours (FLOOD) plus at most the cap and its listener.
        assert _descriptors() - before <= FLOOD + http.MAX_CONNECTIONS + 1
        assert threading.active_count() == threads
        # Most of the flood was dropped: the server closed them (recv sees EOF or a reset).
        closed = 0
        for sock in held[: FLOOD - http.MAX_CONNECTIONS]:
            try:
                closed += sock.recv(1) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == FLOOD - http.MAX_CONNECTIONS
    finally:
        for sock in held:
            sock.close()


def test_an_oversize_head_is_dropped(endpoint: MetricsServer) -> None:
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=30) as sock:
        try:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * (4 * http.MAX_HEAD))
            assert sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            pass
    assert get(endpoint, "/healthz")[0] == 200


def test_close_ends_its_thread_with_connections_still_open() -> None:
    server = serve_metrics("127.0.0.1:0", CollectorRegistry())
    held = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(5)]
    try:
        for sock in held:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        assert get(server, "/healthz")[0] == 200
        server.close()
        # this endpoint's thread (another test's endpoint in this process may still serve)
        name = f"kvcr-metrics-http:{server.port}"
        assert not [t for t in threading.enumerate() if t.name == name]
        for sock in held:  # each was ended, not left waiting for its deadline
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1) == b""
    finally:
        for sock in held:
            sock.close()
