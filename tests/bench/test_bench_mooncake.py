"""The mooncake backend and the ``sglang-mooncake`` comparison: per side a real
``mooncake_master`` and segment process on loopback, real transfers, every byte verified."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcr_policy.bench import BenchSetup, run_bench
from kvcr_policy.bench.resolve import resolve
from kvcr_policy.bench.setup import BenchError
from kvcr_policy.config.loading import load_config
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.pipeline import build_pipeline
from tests.integrations.conftest import SGLANG_MISSING, sglang_installed
from tests.plugins.mooncake.mooncake_helpers import need_mooncake
from tests.support.installs import missing

pytestmark = [pytest.mark.mooncake, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _mooncake() -> None:
    need_mooncake()


def small(**fields: Any) -> BenchSetup:
    values: dict[str, Any] = dict(
        geometry="small",
        layout="page_first",
        tokens=256,
        repeat=1,
        exists_keys=500,
        backend="mooncake",
    )
    values.update(fields)
    return BenchSetup("throughput", "default", **values)


def test_a_mooncake_run_restores_verified_bytes_and_stops_its_processes() -> None:
    data = run_bench(small()).to_dict()
    assert data["verified"] is True and data["backend"] == "mooncake"
    assert data["limit"].startswith("one batch_get_into of the same bytes")
    assert data["limit_gigabytes_per_s"] > 0 and data["restore_gigabytes_per_s"] > 0
    assert data["limit_short"] == "one batch_get_into"
    assert data["host_copy_limit_gigabytes_per_s"] > 0 and data["ratio_to_host_copy_limit"] > 0
    assert data["transport"]["name"] == "mooncake" and data["transport"]["segment_bytes"] == 0
    assert set(data["mooncake"]) == {"P", "Q", "P exists", "Q exists"}
    assert all(one["segment_exit_code"] == 0 for one in data["mooncake"].values())
    assert data["exists_keys_per_s"] > 0 and data["baseline_exists_keys_per_s"] > 0


def test_against_sglangs_own_mooncake_backend_on_the_same_master() -> None:
    if not sglang_installed():
        missing(SGLANG_MISSING)
    data = run_bench(small(peer="sglang-mooncake")).to_dict()
    assert data["verified"] is True
    assert [r["side"] for r in data["runs"]] == ["P", "peer", "peer", "P"]
    for key in (
        "speedup_vs_peer",
        "store_speedup_vs_peer",
        "peer_gigabytes_per_s",
        "peer_store_gigabytes_per_s",
    ):
        assert data[key] > 0
    assert data["exists_keys_per_s"] > 0 and data["baseline_exists_keys_per_s"] > 0
    assert (data["peer"], data["profile"]) == ("sglang-mooncake", "throughput")
    assert set(data["mooncake"]) == {"P", "exists"}


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"backend": "dram"}, "runs with --backend mooncake"),
        ({"layout": "layer_first"}, "--layout page_first or page_first_direct"),
        ({"mla": True}, "an MHA pool"),
    ],
)
def test_the_sglang_mooncake_comparison_refuses_what_sglang_cannot_take(
    fields: dict[str, Any], says: str
) -> None:
    if not sglang_installed():
        missing(SGLANG_MISSING)
    with pytest.raises(BenchError, match=says):
        resolve(small(peer="sglang-mooncake", **fields))


def test_probe_reads_the_same_bytes_back_in_one_call() -> None:
    from kvcr_policy_mooncake.master import MasterProcess

    geometry = PoolGeometry("kv", "page_first", 2, 2, 8, "uint8", 4, 64)  # 16 pages of 256 B
    with MasterProcess() as master:
        overrides = {
            "backend.name": "mooncake",
            "backend.options.master": master.address,
            "backend.options.segment_bytes": "16MiB",
        }
        with build_pipeline(load_config("throughput", environ={}, overrides=overrides)) as pipeline:
            buffer = np.random.default_rng(5).integers(0, 256, geometry.shape, dtype=np.uint8)
            pipeline.register_pool("kv", geometry, buffer)
            original = buffer.copy()
            pipeline.probe(1000)  # stores 3 page-sized objects and a 232-byte one, reads them
            buffer[...] = 0
            pipeline.probe(1000)
            assert np.array_equal(buffer.reshape(-1)[:1000], original.reshape(-1)[:1000])
            assert not buffer.reshape(-1)[1000:].any()
            with pytest.raises(Exception, match="does not fit the pool"):
                pipeline.probe(geometry.nbytes + 1)
