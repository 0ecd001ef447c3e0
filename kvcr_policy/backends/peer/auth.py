"""Peer authentication: key ids, nonces and the proofs of the handshake (both sides import it).

Each side proves that it knows the shared secret without sending it, over nonces that both
sides drew fresh for this connection, so a recorded handshake cannot be replayed::

    c HELLO      key id (names the secret: an HMAC of a constant, not the secret), nonce c
    s CHALLENGE  nonce s, server proof = HMAC(secret, "server" | version | key id | c | s)
    c AUTH       client proof = HMAC(secret, "client" | ... | its UCX worker address),
                 that address
    s WELCOME    the connection is now the tenant's (the tenant that owns that secret)

The client checks the server's proof before it sends its own; the server checks the client's
before it looks at anything else the client sent (its UCX address included). The two roles'
proofs differ, so neither can be reflected as the other's. The client's proof covers the UCX
worker address it sends (length-prefixed), so an AUTH whose address was swapped in transit (a
man in the middle that relays the proofs but points the server's pages at its own worker) is
refused as a failed proof; a shared-memory session sends no address and its proof covers
the empty one. HMAC-SHA256 from the standard
library's :mod:`hmac` and :mod:`hashlib`, nonces from :mod:`secrets` (the OS CSPRNG), proofs
compared with :func:`hmac.compare_digest` (constant time): the well-kept primitives, nothing
written by hand here but their composition.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

__all__ = ["KEY_ID_BYTES", "NONCE_BYTES", "PROOF_BYTES", "key_id", "new_nonce", "proof", "verify"]

NONCE_BYTES = 32
KEY_ID_BYTES = 16
PROOF_BYTES = 32
_LABEL = b"kvcr-policy peer auth v4\x00"
_KEY_ID_LABEL = b"kvcr-policy peer key id\x00"


def key_id(secret: bytes) -> bytes:
    """The name of a secret on the wire: it tells the server which tenant's secret to check
    the proofs against, and reveals nothing that helps to find the secret."""
    return hmac.new(secret, _KEY_ID_LABEL, hashlib.sha256).digest()[:KEY_ID_BYTES]


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def proof(
    secret: bytes,
    role: str,
    key: bytes,
    client_nonce: bytes,
    server_nonce: bytes,
    address: bytes = b"",
) -> bytes:
    """What ``role`` ("server" or "client") sends to prove it knows ``secret``; a client's
    proof binds ``address``, the UCX worker address its AUTH carries."""
    bound = len(address).to_bytes(4, "big") + address
    message = _LABEL + role.encode() + b"\x00" + key + client_nonce + server_nonce + bound
    return hmac.new(secret, message, hashlib.sha256).digest()


def verify(
    secret: bytes,
    role: str,
    key: bytes,
    client_nonce: bytes,
    server_nonce: bytes,
    got: bytes,
    address: bytes = b"",
) -> bool:
    """Whether ``got`` is ``role``'s proof for ``address`` (constant-time comparison)."""
    expected = proof(secret, role, key, client_nonce, server_nonce, address)
    return hmac.compare_digest(expected, got)
