"""Faults across real processes: kill -9 of either side mid-transfer, restart, SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

from tests.backends.peer.peer_helpers import SERVER_SETS, big_geometry, need_ucxx
from tests.support.paths import ROOT
from tests.support.pools import fresh_keys, pages_of, pool_buffer, token_indices

pytestmark = [pytest.mark.ucx, pytest.mark.slow]


HOLDER = """
import sys
sys.path.insert(0, {root!r})
from tests.support.pools import fresh_keys, pool_buffer, token_indices
from tests.backends.peer.peer_helpers import big_geometry
from kvcr_policy import build_pipeline, load_config
p = build_pipeline(load_config(overrides={{"transport.name": "ucx",
    "transport.options.peer": {address!r}}}))
geo = big_geometry("victim")
buf = pool_buffer(geo, 3)
p.register_pool("victim", geo, buf)
keys = fresh_keys(128)
assert all(p.set(keys, token_indices(range(128), geo.page_size), "victim"))
print("stored", flush=True)
while True:
    p.get(keys, token_indices(range(128, 256), geo.page_size), "victim")
    print("got", flush=True)
"""


def tier_counts(pipeline: Any, name: str) -> dict[str, int]:
    tier = pipeline.stats().to_dict()["pools"][name]["peer"]["remote"]["tier"]
    return {"claimed": tier["claimed"], "reserved": tier["reserved"]}


def test_a_client_killed_mid_transfer_leaves_no_claim(peer: Any, connect: Any) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(root=str(ROOT), address=peer.address)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "stored"
        assert holder.stdout.readline().strip() == "got"  # reads are now back to back
        time.sleep(0.05)
    finally:
        holder.kill()
        holder.wait()
    observer = connect()
    geo = big_geometry("victim")
    observer.register_pool("victim", geo, pool_buffer(geo))
    deadline = time.monotonic() + 10
    while tier_counts(observer, "victim") != {"claimed": 0, "reserved": 0}:
        assert time.monotonic() < deadline, tier_counts(observer, "victim")
        time.sleep(0.05)
    assert observer.exists(["nothing"], "victim") == 0  # the server still serves


def test_a_server_killed_mid_transfer_gives_misses_in_time_then_reconnects(connect: Any) -> None:
    need_ucxx()
    from kvcr_policy.bench.server import PeerProcess

    server = PeerProcess(SERVER_SETS)
    port = server.address.rsplit(":", 1)[1]
    timeout = 3.0
    pipeline = connect(address=server.address, **{"transport.op_timeout_s": timeout})
    geo = big_geometry("doomed")
    buffer = pool_buffer(geo, 5)
    pipeline.register_pool("doomed", geo, buffer)
    keys = fresh_keys(128)
    assert all(pipeline.set(keys, token_indices(range(128), geo.page_size), "doomed"))
    view = pages_of(buffer, geo)
    thread, results = reads_until_a_miss(pipeline, geo, keys, view)
    time.sleep(0.03)
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    thread.join(timeout + 10)
    assert not thread.is_alive(), "get hung after the server died"
    got, seconds = results[-1]
    assert seconds >= 0, "a restored page differs from the stored one"
    assert not all(got)
    assert seconds < timeout + 2.0

    restarted = PeerProcess(SERVER_SETS, listen=f"127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 15
        fresh = fresh_keys(4)
        while not all(pipeline.set(fresh, token_indices(range(4), geo.page_size), "doomed")):
            assert time.monotonic() < deadline, "no reconnect after the restart"
            time.sleep(0.2)
        view[:, 128:132] = 0
        assert all(pipeline.get(fresh, token_indices(range(128, 132), geo.page_size), "doomed"))
        assert np.array_equal(view[:, 128:132], view[:, :4])
        assert pipeline.transport.describe()["connects"] >= 2
    finally:
        assert restarted.stop() == 0


def reads_until_a_miss(pipeline: Any, geo: Any, keys: list[str], view: np.ndarray) -> Any:
    """A thread restoring ``keys`` back to back until one restore misses; checks every page
    reported present is byte-exact (no partial page counts). Returns (thread, results); a
    failed check is the last result."""
    source = view[:, : len(keys)].copy()
    n = len(keys)
    results: list[tuple[list[bool], float]] = []
    started: list[float] = []

    def run() -> None:
        for _ in range(500):
            view[:, n : 2 * n] = 0
            start = time.monotonic()
            started.append(start)
            got = pipeline.get(keys, token_indices(range(n, 2 * n), geo.page_size), geo.name)
            results.append((got, time.monotonic() - start))
            arrived = np.flatnonzero(got)
            if not np.array_equal(view[:, n + arrived], source[:, arrived]):
                results.append(([], -1.0))  # a page reported present is not what was stored
                return
            if not all(got):
                return

    thread = threading.Thread(target=run)
    thread.start()
    while len(started) < 2:  # the second restore is under way: the transfer path is warm
        time.sleep(0.001)
    return thread, results


def test_sigterm_mid_transfer_stops_cleanly_and_logs(connect: Any) -> None:
    need_ucxx()
    from kvcr_policy.bench.server import PeerProcess

    server = PeerProcess(SERVER_SETS)
    pipeline = connect(address=server.address, **{"transport.op_timeout_s": 5})
    geo = big_geometry("term")
    buffer = pool_buffer(geo, 9)
    pipeline.register_pool("term", geo, buffer)
    keys = fresh_keys(128)
    assert all(pipeline.set(keys, token_indices(range(128), geo.page_size), "term"))
    thread, results = reads_until_a_miss(pipeline, geo, keys, pages_of(buffer, geo))
    time.sleep(0.03)
    start = time.monotonic()
    assert server.stop(timeout=30) == 0
    assert time.monotonic() - start < 15
    thread.join(15)
    assert not thread.is_alive()
    got, seconds = results[-1]
    assert seconds >= 0, "a restored page differs from the stored one"
    assert not all(got)  # after the stop, restores miss instead of raising
    log = "\n".join(server.log)
    assert f"listening on {server.address}" in log
    assert "got SIGTERM" in log and "stopped" in log and "stay mapped" not in log
