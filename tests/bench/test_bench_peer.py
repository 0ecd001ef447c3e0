"""The peer backend: a real ``kvcr-policy serve`` per side on loopback, real UCX transfers."""

from __future__ import annotations

import numpy as np
import pytest

from kvcr_policy.backends.peer.process import PeerProcess
from kvcr_policy.backends.peer.server.tiers import tier_bytes
from kvcr_policy.bench import BenchSetup, run_bench
from kvcr_policy.config.loading import load_config
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.pipeline import build_pipeline

pytestmark = pytest.mark.ucx


@pytest.fixture(autouse=True)
def _ucxx() -> None:
    try:
        import ucxx  # noqa: F401
    except Exception as err:  # ImportError, or a broken native library
        pytest.skip(f"ucxx cannot be imported ({err}); pip install torch==2.13.0 -e '.[ucx]'")


@pytest.mark.parametrize(
    ("tls", "used", "short"),
    [("auto", {"shm"}, "one copy from the shared tier"), ("tcp", {"tcp"}, "one UCX message")],
)
def test_a_peer_run_restores_verified_bytes_and_stops_its_servers(
    tls: str, used: set[str], short: str
) -> None:
    setup = BenchSetup(
        "throughput",
        "default",
        "small",
        tokens=64,
        repeat=1,
        backend="peer",
        exists_keys=500,
        tls=tls,
    )
    data = run_bench(setup).to_dict()
    assert data["verified"] is True and data["backend"] == "peer"
    assert data["limit_short"] == short and data["limit_gigabytes_per_s"] > 0
    # Beside the transport's own limit, this host's memory copy of the same bytes.
    assert data["host_copy_limit_gigabytes_per_s"] > 0 and data["ratio_to_host_copy_limit"] > 0
    assert all(r["host_copy_limit_gigabytes_per_s"] > 0 for r in data["runs"])
    assert data["transport"]["name"] == "ucx" and data["transport_used"] in used
    assert set(data["peer"]) == {"P", "Q", "P exists", "Q exists"}
    assert all(server["exit_code"] == 0 for server in data["peer"].values())


@pytest.mark.parametrize("shared", ["auto", "off"])
def test_probe_moves_the_peer_tiers_first_bytes(shared: str) -> None:
    geometry = PoolGeometry("kv", "page_first", 2, 2, 8, "uint8", 4, 32)  # 8 pages of 256 B
    capacity = tier_bytes(geometry.pages, geometry.page_bytes)  # a slot costs SLOT_COST at least
    sets = {"transport.name": "ucx", "placement.capacity_bytes": capacity}
    server = PeerProcess(sets)
    try:
        overrides = {
            "transport.name": "ucx",
            "transport.options.peer": server.address,
            "transport.options.shared_memory": shared,
        }
        with build_pipeline(load_config("throughput", environ={}, overrides=overrides)) as pipeline:
            buffer = np.random.default_rng(5).integers(0, 256, geometry.shape, dtype=np.uint8)
            pipeline.register_pool("kv", geometry, buffer)
            original = buffer.copy()
            assert all(pipeline.set([f"k{i}" for i in range(8)], np.arange(32)))
            buffer[...] = 0
            pipeline.probe(1000)
            assert np.array_equal(buffer.reshape(-1)[:1000], original.reshape(-1)[:1000])
            assert not buffer.reshape(-1)[1000:].any()
    finally:
        assert server.stop() == 0
