"""A connection the server closes before it answered HELLO is tried again within the connect
limit (a server whose handshake slots are full drops those that sent nothing yet, and a client
starved between its connect and its HELLO is one of them); any other failure is not."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import pytest

from kvcr_policy.errors import BackendUnavailableError
from tests.backends.peer.test_peer_roundtrip import round_trip
from tests.support.pools import geometry, pool_buffer

pytestmark = [pytest.mark.ucx]


class Dropper:
    """A TCP forwarder to the server that closes its first ``drop`` connections unread, as a
    server with its handshake slots full does to a handshake that has sent nothing yet."""

    def __init__(self, target: str, drop: int) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.drop = drop
        self.accepted = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            if self.accepted <= self.drop:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (src, dst):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()


def test_a_handshake_dropped_before_hello_is_tried_again(peer: Any, connect: Any) -> None:
    dropper = Dropper(peer.address, drop=3)
    try:
        # A generous limit: the three retries wait 50 + 100 + 200 ms.
        pipeline = connect(address=dropper.address, transport__options__connect_timeout_s=60)
        round_trip(pipeline, geometry(pages=8, name="retried"), n=2, name="retried")
        assert dropper.accepted == 4
        assert pipeline.backend.describe()["connects"] == 1
    finally:
        dropper.close()


def test_a_peer_that_drops_every_handshake_fails_within_the_connect_limit(
    peer: Any, connect: Any
) -> None:
    dropper = Dropper(peer.address, drop=1 << 30)
    try:
        pipeline = connect(address=dropper.address, transport__options__connect_timeout_s=0.5)
        with pytest.raises(BackendUnavailableError, match=r"before it answered HELLO within"):
            geo = geometry(pages=4, name="never")
            pipeline.register_pool("never", geo, pool_buffer(geo))
    finally:
        dropper.close()
