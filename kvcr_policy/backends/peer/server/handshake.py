"""The server's side of a connection's handshake (worker thread).

``HELLO`` (key id, nonce) -> ``CHALLENGE`` (nonce, the server's proof) -> ``AUTH`` (the
client's proof, its UCX address) -> the address check -> ``WELCOME``; the proofs are
:mod:`..auth`'s. A shared-memory session (the server's Unix socket) sends no UCX address and
has none to check: WELCOME follows the proof. Until the client's proof is checked, frames are
small (:data:`HELLO_LIMIT`, then :data:`AUTH_LIMIT`), the connection holds only a handshake
slot (see
:mod:`.admission`), and nothing but these two messages is accepted: no tier, no address check,
no UCX endpoint is reachable from a connection that has not authenticated. A failed proof
and an unknown key id get the same answer (ERROR ``AUTH``, then a closed connection).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from kvcr_policy.errors import UnsupportedError

from .. import auth
from ..channel import Channel
from ..credentials import INSECURE_TENANT, Keyring, Tenant
from ..options import MIN_HEARTBEAT_S
from ..wire import messages as m
from ..wire.payload import MAX_ADDRESS
from .admission import Admission

__all__ = ["AUTH_LIMIT", "HELLO_LIMIT", "Admitter", "Handshake", "Opening"]

#: Largest HELLO payload: fixed fields, two names of at most 256 bytes, key id and nonce.
HELLO_LIMIT = 1024
#: Largest AUTH payload: a proof and a UCX worker address.
AUTH_LIMIT = MAX_ADDRESS + 256
#: Heartbeats a client may ask for: faster ones would make the server spin on its checks.
MAX_HEARTBEAT_S = 600.0


class Admitter(Protocol):
    """What a handshake needs from the server: its keys, its admission, its TLS choice and
    the check of a worker address (a session's :class:`~.session.Host` is one too)."""

    keyring: Keyring
    admission: Admission

    def choose_tls(self, hello: m.Hello, local: bool) -> str: ...

    def check_address(
        self,
        address: bytes,
        error_handling: bool,
        tenant: str,
        wanted: Callable[[], bool],
        then: Callable[[bool | Exception], Any],
    ) -> None: ...


class Opening(Protocol):
    """What a handshake needs from the session whose connection it opens."""

    state: str
    tls: str
    peer: str
    heartbeat_s: float
    channel: Channel
    client_host: str
    local: Any

    @property
    def server(self) -> Admitter: ...

    def authenticated(self, tenant: str, admin: bool) -> None: ...

    def welcome(self, ok: bool | Exception, address: bytes, name: str, request: int) -> None: ...


class Handshake:
    """One connection's handshake; the session hands it every message until WELCOME."""

    def __init__(self, session: Opening) -> None:
        self.session = session
        self.hello: m.Hello | None = None
        self.nonce = b""
        self.tenant: Tenant | None = None
        self.request = 0

    def on_message(self, message: m.Message, request: int) -> None:
        state = self.session.state
        self.request = request
        if state == "hello" and isinstance(message, m.Hello):
            self._hello(message, request)
        elif state == "auth" and isinstance(message, m.Auth):
            self._auth(message, request)
        else:
            expected = {"hello": "HELLO", "auth": "AUTH"}.get(state, "nothing before WELCOME")
            self._fail(m.Err.PROTOCOL, f"expected {expected}, got {message.KIND.name}")

    def _fail(self, code: int, text: str) -> None:
        """Answer the request at hand with an ERROR, then close (the client's call then fails
        with the reason, not with a closed connection)."""
        self.session.channel.fail(code, text, self.request)

    def _hello(self, hello: m.Hello, request: int) -> None:
        session = self.session
        server = session.server
        try:
            session.tls = server.choose_tls(hello, session.local is not None)
        except UnsupportedError as err:
            self._fail(m.Err.UNSUPPORTED, str(err))
            return
        keyring = server.keyring
        session.client_host = hello.host_id
        self.hello = hello
        self.nonce = auth.new_nonce()
        if keyring.insecure:
            challenge = m.Challenge(True, self.nonce, b"")
        elif not hello.key_id:
            server.admission.refused(f"client {session.peer} sent no key id (it has no secret)")
            text = (
                "this peer requires authentication and the client has no secret: set "
                "KVCR_POLICY_SECURITY__SECRET or security.secret_file on the client to the "
                "secret `kvcr-policy serve` uses"
            )
            self._fail(m.Err.AUTH, text)
            return
        else:
            self.tenant = keyring.find(hello.key_id)
            secret = self.tenant.secret if self.tenant is not None else keyring.decoy
            proof = auth.proof(secret, "server", hello.key_id, hello.nonce, self.nonce)
            challenge = m.Challenge(False, self.nonce, proof)
        session.state = "auth"
        server.admission.challenged(session, keyring.insecure or self.tenant is not None)
        session.channel.reader.limit = AUTH_LIMIT
        session.channel.send(challenge, request)

    def _auth(self, msg: m.Auth, request: int) -> None:
        session = self.session
        server = session.server
        hello = self.hello
        assert hello is not None
        if server.keyring.insecure:
            name = INSECURE_TENANT
        else:
            tenant = self.tenant
            good = tenant is not None and auth.verify(
                tenant.secret, "client", hello.key_id, hello.nonce, self.nonce, msg.proof
            )
            if not good or tenant is None:
                server.admission.refused(f"client {session.peer} failed authentication")
                text = "authentication failed: this peer does not hold the client's secret"
                self._fail(m.Err.AUTH, text)
                return
            name = tenant.name
        refused = server.admission.admit(session, name)
        if refused is not None:
            server.admission.refused(f"client {session.peer}: {refused}")
            self._fail(m.Err.CAPACITY, refused)
            return
        session.authenticated(name, self.tenant is not None and self.tenant.admin)
        heartbeat = hello.heartbeat_ms / 1000
        if heartbeat > 0:
            heartbeat = min(max(heartbeat, MIN_HEARTBEAT_S), MAX_HEARTBEAT_S)
        session.heartbeat_s = heartbeat
        if session.tls == "shm":
            if msg.address:
                self._fail(m.Err.PROTOCOL, "AUTH: a shared-memory session sends no UCX address")
                return
            session.welcome(True, b"", hello.name, request)
            return
        channel = session.channel
        server.check_address(
            msg.address,
            session.tls == "tcp",
            name,
            lambda: not channel.closed,
            lambda ok: session.welcome(ok, msg.address, hello.name, request),
        )
