"""A peer in another shared-memory world is reached over tcp with error handling, chosen by itself.

This machine has no second host. A server started in its own IPC and PID namespaces
(``unshare``, as root) cannot share memory with the client, exactly like a peer on another host
(UCX's sm transports need a shared IPC and PID namespace); the network stays loopback. What is
faked is only the distance: the bytes still cross a real UCX tcp connection.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

from tests.backends.peer.peer_helpers import SERVER_SETS, need_ucxx
from tests.support.pools import fresh_keys, geometry, pages_of, pool_buffer, token_indices

pytestmark = [pytest.mark.ucx]


def _unshare_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    done = subprocess.run(
        ["unshare", "--ipc", "--pid", "--fork", "true"], capture_output=True, timeout=10
    )
    return done.returncode == 0


@pytest.fixture(scope="module")
def far_peer() -> Any:
    need_ucxx()
    if not _unshare_works():
        pytest.skip("needs root and unshare(1) to start a peer in its own IPC and PID namespaces")
    command = ["unshare", "--ipc", "--pid", "--fork", "--kill-child=SIGTERM"]
    command += [sys.executable, "-m", "kvcr_policy", "serve", "--listen", "127.0.0.1:0"]
    for key, value in SERVER_SETS.items():
        command += ["--set", f"{key}={value}"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(60)
    if not first or not first[0]:
        proc.kill()
        pytest.fail("the namespaced peer did not start within 60 s")
    yield json.loads(first[0])["listening"]
    # unshare(1) does not pass SIGTERM on; ending it makes the kernel send the server SIGTERM
    # (--kill-child), which stops it cleanly.
    proc.kill()
    proc.wait(30)


def test_auto_picks_tcp_for_a_peer_that_cannot_share_memory(far_peer: str) -> None:
    from kvcr_policy import build_pipeline, load_config

    geo = geometry("page_first", pages=16)
    buffer = pool_buffer(geo)
    original = buffer.copy()
    overrides = {
        "transport.name": "ucx",
        "transport.options.peer": far_peer,
        "transport.options.heartbeat_s": 0.5,
    }
    with build_pipeline(load_config("throughput", environ={}, overrides=overrides)) as pipeline:
        pipeline.register_pool("kv", geo, buffer)
        keys = fresh_keys(8)
        assert pipeline.set(keys, token_indices(range(8), geo.page_size)) == [True] * 8
        assert pipeline.exists(keys) == 8
        buffer[...] = 0
        assert pipeline.get(keys, token_indices(range(8, 16), geo.page_size)) == [True] * 8
        described = pipeline.stats().transport
    assert described["transport_used"] == "tcp"
    assert np.array_equal(pages_of(buffer, geo)[:, 8:16], pages_of(original, geo)[:, 0:8])
