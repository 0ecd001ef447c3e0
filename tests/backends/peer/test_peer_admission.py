"""Handshake slots under a flood (red team 2026-12-b, B9): a HELLO naming a known key id
outranks a silent socket and a HELLO with a made-up key id, and one address cannot take more
than its share of the slots. The rules alone first (no UCX), then against a real server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy.backends.peer import auth
from kvcr_policy.backends.peer.server.admission import (
    MAX_HANDSHAKES,
    MAX_HANDSHAKES_PER_ADDRESS,
    Admission,
)
from kvcr_policy.backends.peer.wire import messages as m
from tests.backends.peer.raw_client import Raw, hello
from tests.backends.peer.tenants import start_peer, tenants_dir


def _fill(admission: Admission, count: int, address: str, known: bool | None) -> list[str]:
    sessions = [f"{address}-{known}-{i}" for i in range(count)]
    for session in sessions:
        assert admission.victim(address) is None
        admission.arrived(session, address)
        if known is not None:
            admission.challenged(session, known)
    return sessions


def test_a_known_key_id_outlasts_a_flood_of_made_up_ones() -> None:
    admission = Admission(64)
    (legit,) = _fill(admission, 1, "10.0.0.1", known=True)
    flood = _fill(admission, MAX_HANDSHAKES_PER_ADDRESS, "10.0.0.9", known=False)
    flood += _fill(admission, MAX_HANDSHAKES - len(flood) - 1, "10.0.0.8", known=False)
    for _ in range(500):  # newcomers from the flooding hosts, each taking a slot
        victim = admission.victim("10.0.0.8")
        assert victim is not None and victim != legit
        admission.left(victim)
        admission.arrived(object(), "10.0.0.8")
    assert admission.handshakes == MAX_HANDSHAKES


def test_silent_sockets_go_first_and_one_address_displaces_its_own() -> None:
    admission = Admission(64)
    crowd = _fill(admission, MAX_HANDSHAKES_PER_ADDRESS, "10.0.0.9", known=None)
    assert admission.victim("10.0.0.9") == crowd[0]  # at its own limit: its oldest
    assert admission.victim("10.0.0.1") is None  # another address still gets a slot
    others = _fill(admission, MAX_HANDSHAKES - MAX_HANDSHAKES_PER_ADDRESS, "10.0.0.1", True)
    assert admission.victim("10.0.0.2") == crowd[0]  # silent, from the busiest address
    assert admission.victim("10.0.0.1") == others[0]  # at its limit too: its own oldest


# ---- against a real server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tenants_dir(tmp_path_factory.mktemp("admission"))


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[Any]:
    peer = start_peer(folder, **{"security.handshake_timeout_s": 30})
    yield peer
    peer.stop()


@pytest.mark.ucx
def test_a_flood_of_made_up_key_ids_does_not_drop_a_real_handshake(
    server: Any, folder: Path, worker: Any
) -> None:
    """The legitimate client is the oldest handshake, halfway (CHALLENGE received, AUTH not
    yet sent), when 4 x 64 HELLOs with random key ids arrive; it still gets its WELCOME."""
    secret = (folder / "alice").read_text().strip().encode()
    with Raw(server.address, timeout=30) as legit:
        opening = hello(secret)
        challenge = legit.ask(opening)
        assert isinstance(challenge, m.Challenge)
        flood: list[Raw] = []
        try:
            for _ in range(4 * MAX_HANDSHAKES):
                raw = Raw(server.address, timeout=30)
                raw.send(m.Hello(0, 0, 0, 1000, "x", "x", os.urandom(auth.KEY_ID_BYTES),
                                 auth.new_nonce()))  # fmt: skip
                flood.append(raw)
            for raw in flood[-MAX_HANDSHAKES // 2 :]:  # the newest were answered: evidence
                assert isinstance(raw.reply(), m.Challenge)
            proof = auth.proof(secret, "client", opening.key_id, opening.nonce, challenge.nonce,
                               worker.address)  # fmt: skip
            assert isinstance(legit.ask(m.Auth(proof, worker.address)), m.Welcome)
        finally:
            for raw in flood:
                raw.close()
