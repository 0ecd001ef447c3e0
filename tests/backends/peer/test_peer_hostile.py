"""Hostile frames over a real connection: error reply or closed connection, never a dead server."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.backends.peer.wire.framing import HEADER, MAGIC, MAX_PAYLOAD, VERSION, FrameReader
from tests.backends.peer.raw_client import Raw, default_secret, open_socket
from tests.strategies import hostile_frames
from tests.support.pools import fresh_keys, geometry, pool_buffer, token_indices

pytestmark = pytest.mark.ucx


def _connect(peer: Any, quiet_after: float = 3.0) -> socket.socket:
    sock = open_socket(peer.address)
    sock.settimeout(quiet_after)
    return sock


def _replies(sock: socket.socket) -> tuple[list[m.Message], bool]:
    """Frames the server sent until it closed (True) or went quiet (False)."""
    reader = FrameReader(m.KINDS)
    out: list[m.Message] = []
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return out, True
            out.extend(m.decode(frame) for frame in reader.feed(data))
    except (TimeoutError, ConnectionResetError):
        return out, False


def _assert_alive(peer: Any, connect: Any) -> None:
    assert peer.proc.poll() is None, "the server died"
    pipeline = connect()
    geo = geometry(pages=8, name="alive")
    pipeline.register_pool("alive", geo, pool_buffer(geo))
    keys = fresh_keys(2)
    assert pipeline.set(keys, token_indices(range(2), geo.page_size), "alive") == [True, True]


@pytest.mark.parametrize(
    "data",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        HEADER.pack(MAGIC, VERSION, int(m.Kind.HELLO), MAX_PAYLOAD + 1, 1),
        HEADER.pack(MAGIC, VERSION + 7, int(m.Kind.HELLO), 0, 1),
        m.encode(m.Exists(0, ["a"]), 1),  # a request before HELLO
        HEADER.pack(MAGIC, VERSION, int(m.Kind.HELLO), 4, 1) + b"\xff\xff\xff\xff",
    ],
    ids=["http", "oversize", "version", "no-hello", "truncated-hello"],
)
def test_bad_openings_close_the_connection(peer: Any, data: bytes) -> None:
    with _connect(peer) as sock:
        sock.sendall(data)
        _, closed = _replies(sock)
    assert closed


def _real_address() -> bytes:
    from kvcr_policy.backends.peer.options import UcxOptions
    from kvcr_policy.backends.peer.worker import acquire_worker

    worker = acquire_worker(UcxOptions())
    worker.release()  # the address stays a valid byte string to mutate
    return worker.address


@pytest.mark.parametrize("kind", ["noise", "version-assert"])
def test_a_bad_worker_address_is_refused_not_fatal(peer: Any, connect: Any, kind: str) -> None:
    # First byte 0x22 makes UCX 1.21 abort the process that unpacks the address
    # (address.c: Assertion `*addr_version == UCP_OBJECT_VERSION_V2'); the server's
    # checker process takes that hit instead of the server.
    address = b"\x20\xa4\x92" + bytes(range(200))
    if kind == "version-assert":
        address = b"\x22" + _real_address()[1:]
    with Raw(peer.address) as raw:
        answer = raw.handshake(default_secret(), address)
        assert isinstance(answer, m.Error) and "worker address" in answer.text
        assert raw.reply() is None  # closed
    _assert_alive(peer, connect)


def test_a_truncated_frame_then_silence_is_harmless(peer: Any, connect: Any) -> None:
    with _connect(peer) as sock:
        frame = m.encode(m.Exists(0, ["k"] * 100), 1)
        sock.sendall(frame[: len(frame) // 2])
    _assert_alive(peer, connect)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=hostile_frames())
def test_hostile_frames_after_a_real_handshake(peer: Any, worker: Any, data: bytes) -> None:
    with Raw(peer.address) as raw:
        assert isinstance(raw.handshake(default_secret(), worker.address), m.Welcome)
        raw.sock.settimeout(0.3)
        raw.sock.sendall(data)
        _replies(raw.sock)
    assert peer.proc.poll() is None


def test_the_server_survives_all_of_it_and_logs_why(peer: Any, connect: Any) -> None:
    _assert_alive(peer, connect)
    log = "\n".join(peer.log)
    assert "protocol error" in log and "closing the connection" in log
