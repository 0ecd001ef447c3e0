"""A server whose address checker starts slowly (importing ucxx on a busy host) still starts:
the start-up probe waits for the helper's own start limit, then for the check's."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvcr_policy import load_config
from kvcr_policy.backends.peer.server import server as server_module
from kvcr_policy.backends.peer.server.addrcheck import AddressChecker
from tests.backends.peer.peer_helpers import need_ucxx

pytestmark = [pytest.mark.ucx]

# The helper sleeps this long before it imports anything: longer than the check's own limit
# (made short here), as a helper importing ucxx on a loaded 2-core host was seen to take.
_DELAY_S = 2.0
_SLOW_HELPER = (
    "import runpy, time\n"
    f"time.sleep({_DELAY_S})\n"
    "runpy.run_module('kvcr_policy.backends.peer.server.addrcheck', run_name='__main__')\n"
)


def _slow_spawn(self: AddressChecker) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", _SLOW_HELPER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )


def test_a_slow_starting_checker_delays_the_server_instead_of_failing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    need_ucxx()
    monkeypatch.setattr(AddressChecker, "_spawn", _slow_spawn)
    monkeypatch.setattr(server_module, "CHECK_TIMEOUT_S", _DELAY_S / 4)
    with server_module.PeerServer(
        load_config(overrides={"security.insecure": True}), listen="127.0.0.1:0"
    ) as peer:
        assert peer.state == "open"
