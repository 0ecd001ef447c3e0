"""A client that dies while UCX wires its endpoint up never takes `serve` down.

UCX sends wire-up messages between the two workers of a session; the server handles one by
choosing its endpoint's lanes again from the sender's address. A sender that died before the
server got to it left a shared-memory segment that cannot be opened any more, and with tcp also
offered the choice came out different, which UCX 1.21 answers with abort() ("endpoint
reconfiguration not supported yet"): seen once in a CI run, as a client killed mid-SET. The
dying client (:mod:`tests.backends.peer.dying_client`) sends that message and kills itself at
once, a few progress calls apart, on a server already busy with other work; the server must
live through every one, close each dead session, and serve a real client byte-exact after.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from kvcr_policy.backends.peer.env import same_host_tls
from tests.backends.peer.test_peer_roundtrip import round_trip
from tests.support.paths import ROOT
from tests.support.pools import geometry

DEATHS = 10  # on the tree before the fix, the server died within the first three


def die_while_wiring_up(peer: Any, progress: int) -> None:
    """Run one dying client; then the server must still be there."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.backends.peer.dying_client", peer.address, str(progress)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # a bound against a hang only: a handshake and one send
        check=False,
    )
    assert peer.proc.poll() is None, "the server died:\n" + "\n".join(peer.log[-15:])
    said = done.stdout + done.stderr
    assert "dying" in done.stdout, f"the dying client did not get going:\n{said}"


@pytest.mark.ucx
@pytest.mark.slow
@pytest.mark.usefixtures("load")
def test_clients_dying_mid_wireup_never_take_the_server_down(peer: Any, connect: Any) -> None:
    for death in range(DEATHS):
        die_while_wiring_up(peer, (0, 1, 2, 5, 20)[death % 5])
    pipeline = connect("throughput")
    round_trip(pipeline, geometry(pages=8, name="after"), n=4, name="after")
    assert pipeline.backend.describe()["transport_used"] == "sm"
    assert peer.proc.poll() is None


@pytest.mark.parametrize(
    ("tls", "expected"),
    [
        (None, "self,sm"),  # UCX_TLS unset (transport.options.cma on): every transport
        ("all", "self,sm"),
        ("^ib", "self,sm"),
        ("self,posix,tcp", "self,posix"),  # this transport's default
        ("rc,sm,self", "sm,self"),
        ("tcp,self", None),  # no shared memory offered: the process's own settings
        ("tcp", None),
        ("self, posix , cma", "self,posix,cma"),
    ],
)
def test_same_host_sessions_offer_shared_memory_transports_only(
    tls: str | None, expected: str | None
) -> None:
    assert same_host_tls(tls) == expected
