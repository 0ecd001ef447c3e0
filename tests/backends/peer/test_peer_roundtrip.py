"""Real ucxx across two processes on loopback: byte-exact round trips, concurrency, handshake."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

from kvcr_policy.errors import UnsupportedError
from tests.backends.peer.peer_helpers import need_ucxx
from tests.support.paths import ROOT
from tests.support.pools import fresh_keys, geometry, pages_of, pool_buffer, token_indices

pytestmark = [pytest.mark.ucx, pytest.mark.usefixtures("load")]

CASES = [
    ("layer_first", False, None),
    ("layer_first", False, "throughput"),
    ("page_first", False, "throughput"),
    ("page_first_direct", False, None),
    ("page_head", False, "throughput"),
    ("layer_first", True, "throughput"),
    ("page_first_direct", True, None),
]


def round_trip(pipeline: Any, geo: Any, n: int = 4, name: str = "kv", seed: int = 0) -> None:
    """Store pages 0..n-1, restore them into n..2n-1 of the same buffer, compare bytes."""
    buffer = pool_buffer(geo, seed)
    pipeline.register_pool(name, geo, buffer)
    keys = fresh_keys(n)
    assert pipeline.set(keys, token_indices(range(n), geo.page_size), name) == [True] * n
    assert pipeline.exists([*keys, "absent"], name) == n
    view = pages_of(buffer, geo)
    view[:, n : 2 * n] = 0
    assert pipeline.get(keys, token_indices(range(n, 2 * n), geo.page_size), name) == [True] * n
    assert np.array_equal(view[:, :n], view[:, n : 2 * n])


@pytest.mark.parametrize(("layout", "mla", "profile"), CASES)
def test_pages_round_trip_byte_exact(connect: Any, layout: str, mla: bool, profile: str) -> None:
    geo = geometry(layout, pages=8, mla=mla, name=f"{layout}-{mla}")
    round_trip(connect(profile, **{"coalescing.split_bytes": 96}), geo, n=4, name=geo.name)


def test_scattered_pages_partial_runs_delete_and_clear(connect: Any) -> None:
    geo = geometry(pages=16, name="scatter")
    pipeline = connect("throughput")
    buffer = pool_buffer(geo, 1)
    pipeline.register_pool("scatter", geo, buffer)
    keys = fresh_keys(6)
    src = np.array([5, 1, 2, 3, 9, 0])
    assert pipeline.set(keys, token_indices(src, geo.page_size), "scatter") == [True] * 6
    view = pages_of(buffer, geo)
    expected = view[:, src].copy()
    dst = np.array([15, 14, 10, 11, 12, 13])
    view[:, dst] = 0
    # A missing key in the middle: only the leading run is read.
    wanted = [*keys[:3], "missing", *keys[3:]]
    got = pipeline.get(wanted, token_indices([*dst[:3], 4, *dst[3:6]], geo.page_size), "scatter")
    assert got[:3] == [True] * 3 and got[3] is False
    assert np.array_equal(view[:, dst[:3]], expected[:, :3])
    assert pipeline.delete(keys[:2], "scatter") == 2
    assert pipeline.exists(keys, "scatter") == 0
    assert pipeline.exists(keys[2:], "scatter") == 4
    pipeline.clear()
    assert pipeline.exists(keys[2:], "scatter") == 0
    stats = pipeline.stats().to_dict()["pools"]["scatter"]["peer"]
    assert stats["transport_used"] == "sm"
    assert stats["remote"]["tier"]["claimed"] == 0 and stats["remote"]["tier"]["reserved"] == 0


def test_tcp_is_chosen_when_asked_and_reported(connect: Any) -> None:
    pipeline = connect("throughput", **{"transport.options.tls": "tcp"})
    round_trip(pipeline, geometry(pages=8, name="tcp"), n=3, name="tcp")
    assert pipeline.backend.describe()["transport_used"] == "tcp"


CLIENT = """
import sys, numpy as np
sys.path.insert(0, {root!r})
from tests.support.pools import geometry, fresh_keys, pages_of, pool_buffer, token_indices
from kvcr_policy import build_pipeline, load_config
p = build_pipeline(load_config(overrides={{"transport.name": "ucx",
    "transport.options.peer": {address!r}}}))
geo = geometry(pages=8, name="shared")
buf = pool_buffer(geo, 7)
p.register_pool("shared", geo, buf)
for round in range(5):
    keys = fresh_keys(4)
    assert p.set(keys, token_indices(range(4), geo.page_size), "shared") == [True] * 4
    pages_of(buf, geo)[:, 4:] = 0
    assert p.get(keys, token_indices(range(4, 8), geo.page_size), "shared") == [True] * 4
    assert np.array_equal(pages_of(buf, geo)[:, :4], pages_of(buf, geo)[:, 4:])
p.close()
print("client ok")
"""


def test_several_concurrent_clients(connect: Any, peer: Any) -> None:

    other = subprocess.Popen(
        [sys.executable, "-c", CLIENT.format(root=str(ROOT), address=peer.address)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            pipeline = connect("throughput" if i % 2 else None)
            geo = geometry("page_first" if i % 2 else "layer_first", pages=8, name="shared")
            for round in range(5):
                round_trip_fresh(pipeline, geo, seed=10 * i + round, first=round == 0)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    out, err = other.communicate(timeout=60)
    assert not errors, errors
    assert other.returncode == 0 and "client ok" in out, err[-2000:]


_buffers: dict[int, tuple[Any, np.ndarray]] = {}


def round_trip_fresh(pipeline: Any, geo: Any, *, seed: int, first: bool) -> None:
    if first:
        _buffers[id(pipeline)] = (geo, pool_buffer(geo, seed))
        pipeline.register_pool("shared", geo, _buffers[id(pipeline)][1])
    geo, buffer = _buffers[id(pipeline)]
    view = pages_of(buffer, geo)
    view[:, :4] = np.random.default_rng(seed).integers(0, 256, view[:, :4].shape, np.uint8)
    keys = fresh_keys(4)
    assert pipeline.set(keys, token_indices(range(4), geo.page_size), "shared") == [True] * 4
    view[:, 4:] = 0
    assert pipeline.get(keys, token_indices(range(4, 8), geo.page_size), "shared") == [True] * 4
    assert np.array_equal(view[:, :4], view[:, 4:])


@pytest.fixture
def bare_peer() -> Any:
    """An in-process server that declares no coalescing or split capability."""
    need_ucxx()
    from kvcr_policy import load_config
    from kvcr_policy.backends.peer.options import UcxOptions
    from kvcr_policy.backends.peer.server.server import PeerServer

    loaded = load_config(overrides={"placement.capacity_bytes": "64MiB"})
    server = PeerServer(
        loaded, listen="127.0.0.1:0", options=UcxOptions(capabilities=(), check_addresses=False)
    )
    with server:
        yield server


def test_handshake_refuses_or_falls_back_without_capabilities(
    connect: Any, bare_peer: Any, caplog: Any
) -> None:
    strict = connect(
        "throughput", address=bare_peer.address, **{"coalescing.on_unsupported": "error"}
    )
    geo = geometry(pages=8, name="bare")
    with pytest.raises(UnsupportedError, match="cannot coalesce or split"):
        strict.register_pool("bare", geo, pool_buffer(geo))
    lenient = connect("throughput", address=bare_peer.address)
    with caplog.at_level("WARNING"):
        round_trip(lenient, geo, n=4, name="bare")
    assert "sending plain descriptors" in caplog.text


def test_small_batches_in_a_window_deliver_in_order(connect: Any) -> None:
    pipeline = connect(
        "throughput",
        **{
            "batching.read_batch_pages": 2,
            "batching.read_batch_bytes": None,  # batches of 2 pages, not joined
            "batching.window_batches": 3,
            "batching.window_pages": 4,
        },
    )
    geo = geometry(pages=24, name="window")
    buffer = pool_buffer(geo, 4)
    pipeline.register_pool("window", geo, buffer)
    keys = fresh_keys(12)
    assert pipeline.set(keys, token_indices(range(12), geo.page_size), "window") == [True] * 12
    view = pages_of(buffer, geo)
    view[:, 12:] = 0
    ready: list[int] = []
    got = pipeline.get(
        keys, token_indices(range(12, 24), geo.page_size), "window", on_ready=ready.append
    )
    assert got == [True] * 12
    assert np.array_equal(view[:, :12], view[:, 12:])
    assert ready == sorted(ready) and ready[-1] == 12 and len(ready) == 6
    stats = pipeline.stats()
    assert stats.batches == 12  # 6 to store, 6 to restore
    assert stats.peak_inflight_batches == 2  # window_pages 4 holds two batches of 2 pages


def test_effective_ucx_settings_are_reported(connect: Any) -> None:
    pipeline = connect()
    geo = geometry(pages=8, name="report")
    pipeline.register_pool("report", geo, pool_buffer(geo))
    described = pipeline.backend.describe()
    env = described["ucx_env"]["env"]
    assert env["UCX_TCP_TX_SEG_SIZE"]["value"] == str(512 << 10)
    assert {"value", "source"} <= set(env["UCX_RNDV_THRESH"])
    assert described["progress_mode"] in ("blocking", "polling", "thread")
    assert described["transport_used"] == "sm"


def test_a_connection_without_handshake_is_dropped(bare_peer: Any, monkeypatch: Any) -> None:
    import socket

    monkeypatch.setattr(bare_peer, "handshake_timeout_s", 0.3)
    host, port = bare_peer.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.settimeout(5)
        assert sock.recv(1) == b""  # closed by the server, not by our timeout


MODE_CLIENT = """
import sys
sys.path.insert(0, {root!r})
from kvcr_policy import build_pipeline, load_config
from tests.backends.peer.test_peer_roundtrip import round_trip
from tests.support.pools import geometry
p = build_pipeline(load_config(overrides={{"transport.name": "ucx",
    "transport.options.peer": {address!r}, "transport.options.progress_mode": {mode!r}}}))
for i in range(3):  # a connection per round: each gets a UCX worker of its own, retired after
    round_trip(p, geometry(pages=8, name=f"kv{{i}}"), n=4, name=f"kv{{i}}", seed=i)
    client = p.backend._client
    conn = client.connection()
    client.worker.submit(conn.fail, "the next round reconnects").result()
print("links", p.backend.describe()["links"])
p.close()
print("ok")
"""


@pytest.mark.parametrize("mode", ["blocking", "polling", "thread"])
def test_every_progress_mode_moves_pages_and_retires_its_workers(mode: str) -> None:
    """Server and client both in ``mode``: byte-exact round trips over three connections, and
    each connection's UCX worker (a link) retired, not left behind."""
    need_ucxx()
    from kvcr_policy.backends.peer.process import PeerProcess

    server = PeerProcess({"transport.name": "ucx", "transport.options.progress_mode": mode})
    try:
        code = MODE_CLIENT.format(root=str(ROOT), address=server.address, mode=mode)
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
        assert "'links_open': 0" in done.stdout, done.stdout
    finally:
        assert server.stop() == 0
