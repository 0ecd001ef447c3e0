"""A client that speaks the peer protocol by hand over a control socket (no UCX data moves).

Tests use it to say what a library client never would: another tenant's requests, a wrong
proof, frames cut short or trickled.
"""

from __future__ import annotations

import os
import socket

from kvcr_policy.backends.peer import auth
from kvcr_policy.backends.peer.credentials import default_secret_file
from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.backends.peer.wire.framing import FrameReader


def open_socket(address: str, timeout: float = 5.0) -> socket.socket:
    """A plain TCP connection to a server's ``HOST:PORT``, or a Unix one to ``unix:PATH`` /
    ``unix:@NAME`` (nothing sent yet)."""
    if address.startswith("unix:"):
        path = address[len("unix:") :]
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect("\0" + path[1:] if path.startswith("@") else path)
        return sock
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=timeout)


def default_secret() -> bytes:
    """The secret the suite's servers created (tests/conftest.py points XDG_CONFIG_HOME)."""
    return default_secret_file().read_text(encoding="utf-8").strip().encode()


def hello(secret: bytes | None, nonce: bytes | None = None, tls: int = 0) -> m.Hello:
    key = auth.key_id(secret) if secret is not None else b""
    caps = m.capability_mask(m.CAPABILITIES)
    return m.Hello(caps, tls, 0, 10_000, "raw", "raw", key, nonce or auth.new_nonce())


class Raw:
    """One request, one reply, over a raw control socket."""

    def __init__(self, address: str, timeout: float = 5.0) -> None:
        self.sock = open_socket(address, timeout)
        self.unix = self.sock.family == socket.AF_UNIX
        self.fds: list[int] = []  # passed with frames on a Unix socket, oldest first
        self.reader = FrameReader(m.KINDS)
        self.pending: list[tuple[int, m.Message]] = []
        self.ids = iter(range(1, 1 << 30))
        self.welcome: m.Welcome | None = None

    def send(self, message: m.Message) -> None:
        self.sock.sendall(m.encode(message, next(self.ids)))

    def reply(self) -> m.Message | None:
        """The next message, or None once the server closed the connection."""
        got = self.frame()
        return None if got is None else got[1]

    def frame(self) -> tuple[int, m.Message] | None:
        """The next message with the request id it answers, or None once the server closed
        the connection (a frame that does not decode raises ProtocolError)."""
        while not self.pending:
            try:
                if self.unix:
                    data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 16)
                    self.fds.extend(fds)
                else:
                    data = self.sock.recv(1 << 16)
            except ConnectionResetError:
                return None
            if not data:
                return None
            self.pending.extend((f.request, m.decode(f)) for f in self.reader.feed(data))
        return self.pending.pop(0)

    def ask(self, message: m.Message) -> m.Message | None:
        self.send(message)
        return self.reply()

    def handshake(self, secret: bytes | None, address: bytes) -> m.Message | None:
        """HELLO, CHALLENGE, AUTH with ``secret`` (None: none); the server's last answer."""
        return self.handshake_with(hello(secret), secret, address)

    def handshake_with(
        self, opening: m.Hello, secret: bytes | None, address: bytes
    ) -> m.Message | None:
        """:meth:`handshake` opened by the HELLO ``opening`` (its key id matches ``secret``)."""
        challenge = self.ask(opening)
        if not isinstance(challenge, m.Challenge):
            return challenge
        proof = b""
        if secret is not None and not challenge.insecure:
            assert auth.verify(
                secret, "server", opening.key_id, opening.nonce, challenge.nonce, challenge.proof
            ), "the server's proof does not match"
            proof = auth.proof(
                secret, "client", opening.key_id, opening.nonce, challenge.nonce, address
            )
        answer = self.ask(m.Auth(proof, address))
        if isinstance(answer, m.Welcome):
            self.welcome = answer
        return answer

    def close(self) -> None:
        self.sock.close()
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
