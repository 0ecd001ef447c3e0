"""The cuda target: a GPU pool offloaded to each tier and restored into, checked on the GPU.

Needs a CUDA device (CI has none): on a GPU machine run
``python -m pytest tests/bench/test_bench_cuda.py -rs``. The refusal without one is tested in
``test_bench_plan.py`` and ``test_bench_command.py``.
"""

from __future__ import annotations

import pytest

from kvcr_policy.bench import BenchSetup, run_bench

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible (CI)"),
]


@pytest.mark.parametrize("scatter", [False, True])
def test_restores_verified_bytes_on_a_small_pool(scatter: bool) -> None:
    setup = BenchSetup(
        "throughput", "default", "small", tokens=4096, repeat=1, scatter=scatter,
        target="cuda", exists_keys=1000,
    )  # fmt: skip
    data = run_bench(setup).to_dict()
    assert data["verified"] is True and data["target"] == "cuda"
    assert data["bytes"] == 4096 * 2 * 16 * 8 * 64 * 2  # K+V, 16 layers, 8x64 bf16
    assert data["transport"]["name"] == "cuda"
    assert data["transport"]["registrations"][0]["bytes"] == data["bytes"]
    assert data["device"] and all(r["verified"] for r in data["runs"])
    # The host's memory copy beside the pinned copy over PCIe, for every restore.
    assert all(r["host_copy_limit_gigabytes_per_s"] > 0 for r in data["runs"])
    assert data["ratio_to_host_copy_limit"] > 0 and data["ratio_to_limit"] > 0
    if scatter:  # scattered slots: nothing for coalescing to merge
        assert data["descriptors"]["P"]["after"] > data["pages"]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_ranks_restore_their_shards_on_their_own_gpus() -> None:
    setup = BenchSetup(
        "throughput", "default", "small", tokens=4096, repeat=1, target="cuda", exists_keys=1000,
        ranks=2,
    )  # fmt: skip
    data = run_bench(setup).to_dict()
    shard = 4096 * 16 * 1024  # small: 32 KiB per token over 8 KV heads, 4 heads per rank
    assert data["verified"] is True and data["ranks"] == 2
    assert (data["rank_bytes"], data["bytes"]) == (shard, 2 * shard)
    assert data["aggregate_ratio_to_limit"] == data["ratio_to_limit"] > 0
    assert data["aggregate_ratio_to_host_copy_limit"] == data["ratio_to_host_copy_limit"] > 0
    ranks = data["per_rank"]
    assert [r["gpu"]["device"] for r in ranks] == ["cuda:0", "cuda:1"]
    for rank in ranks:
        assert rank["verified"] and rank["memory"]["P"]["pinned_bytes"] == shard
        assert rank["memory"]["total"]["pinned_bytes"] == 2 * shard
    assert data["host"]["pinned_bytes"] == 4 * shard
