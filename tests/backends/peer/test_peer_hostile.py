"""Hostile frames over a real connection: error reply or closed connection, never a dead server.

What docs/peer.md promises for each frame: a malformed one gets an error reply or a closed
connection (and a log line); a frame cut short is closed once ``op_timeout_s`` passed since its
first byte (``security.handshake_timeout_s`` before authentication); whole, well-formed frames
are handled like any request, and the session still answers a PING afterwards. Every wait is
bounded by those settings of the server's loaded configuration and a heartbeat of slack
(:func:`promised_s`); the server here has short ones so that a cut frame is closed quickly.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings

from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.backends.peer.wire.framing import HEADER, MAGIC, MAX_PAYLOAD, VERSION, FrameReader
from kvcr_policy.config.schema import PolicyConfig
from kvcr_policy.errors import ProtocolError
from tests.backends.peer.peer_helpers import SERVER_SETS, promised_s, server_config
from tests.backends.peer.raw_client import Raw, default_secret, open_socket
from tests.strategies import hostile_frames
from tests.support.pools import fresh_keys, geometry, pool_buffer, token_indices

pytestmark = pytest.mark.ucx

SETS = {
    **SERVER_SETS,
    "transport.op_timeout_s": 1,  # a frame cut short is closed after this
    "security.handshake_timeout_s": 3,  # long enough for a real handshake on a loaded host
}
CONFIG: PolicyConfig = server_config(SETS)
PEER_SETS = SETS  # this module's server (the package's `peer` fixture reads it)


def handshake_bound(config: PolicyConfig = CONFIG) -> float:
    """:func:`promised_s` before authentication, where the handshake timeout stands in for
    op_timeout_s."""
    return config.security.handshake_timeout_s + float(config.transport.options["heartbeat_s"])


def _replies(
    sock: socket.socket, seconds: float, until: type[m.Message] | None = None
) -> tuple[list[m.Message], bool]:
    """Frames the server sent until it closed (True), sent nothing for ``seconds`` (False), or
    sent an ``until`` message (False)."""
    reader = FrameReader(m.KINDS)
    out: list[m.Message] = []
    sock.settimeout(seconds)
    try:
        while until is None or not any(isinstance(reply, until) for reply in out):
            data = sock.recv(65536)
            if not data:
                return out, True
            out.extend(m.decode(frame) for frame in reader.feed(data))
        return out, False
    except TimeoutError:
        return out, False
    except ConnectionResetError:  # closed with our bytes unread
        return out, True


def _refused(replies: list[m.Message], closed: bool) -> bool:
    """docs/peer.md's answer to a malformed frame: an error reply or a closed connection."""
    return closed or any(isinstance(reply, m.Error) for reply in replies)


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
    with open_socket(peer.address) as sock:
        sock.sendall(data)
        _, closed = _replies(sock, handshake_bound())
    assert closed


def _real_address() -> bytes:
    from kvcr_policy.backends.peer.options import UcxOptions
    from kvcr_policy.backends.peer.worker import acquire_worker

    loop = acquire_worker(UcxOptions())
    try:
        link = loop.submit(loop.open_link, "an address to mutate").result()
        loop.submit(link.retire, 0.0).result()
    finally:
        loop.release()
    return link.address  # stays a valid byte string to mutate


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


def test_a_frame_cut_short_before_hello_is_closed_at_the_handshake_timeout(
    peer: Any, connect: Any
) -> None:
    frame = m.encode(m.Exists(0, ["k"] * 100), 1)
    with open_socket(peer.address) as sock:
        sock.sendall(frame[: len(frame) // 2])
        replies, closed = _replies(sock, handshake_bound())
    assert closed, f"still open {handshake_bound()} s after a cut frame"
    assert all(isinstance(reply, m.Error) for reply in replies), replies
    _assert_alive(peer, connect)


def _expected(data: bytes) -> str:
    """What the server must do with ``data`` sent after WELCOME, judged by the protocol's own
    reader and decoder: ``refuse`` a malformed frame, ``wait`` for the rest of one cut short,
    or ``serve`` whole, well-formed frames."""
    reader = FrameReader(m.KINDS)  # MAX_PAYLOAD, as after authentication
    try:
        for frame in reader.feed(data):
            m.decode(frame)
    except ProtocolError:
        return "refuse"
    return "wait" if reader.partial else "serve"


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=hostile_frames())
def test_hostile_frames_after_a_real_handshake(peer: Any, worker: Any, data: bytes) -> None:
    expected = _expected(data)
    event(f"expected: {expected}")
    bound = promised_s(CONFIG)
    with Raw(peer.address) as raw:
        assert isinstance(raw.handshake(default_secret(), worker.address), m.Welcome)
        raw.sock.sendall(data)
        if expected == "serve":  # and then a PING, which a working session answers
            # The server may have closed already (a request it refused).
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                raw.send(m.Ping())
        replies, closed = _replies(raw.sock, bound, m.Pong if expected == "serve" else None)
    assert peer.proc.poll() is None, "the server died"
    if expected == "refuse":
        assert _refused(replies, closed), f"malformed, yet no error and still open: {replies}"
    elif expected == "wait":
        assert closed, f"a frame cut short was still open after {bound} s: {replies}"
    else:
        pong = any(isinstance(reply, m.Pong) for reply in replies)
        assert closed or pong, f"well-formed, yet no answer to PING within {bound} s: {replies}"


def test_the_server_survives_all_of_it_and_logs_why(peer: Any, connect: Any) -> None:
    _assert_alive(peer, connect)
    log = "\n".join(peer.log)
    assert "protocol error" in log and "closing the connection" in log
