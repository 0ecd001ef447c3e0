"""``--ranks N`` on the cpu target: N rank processes in lockstep, their figures aggregated.

The cuda target runs the same code with one GPU per rank; this host has none, so here the
ranks are host-pool processes (real ``spawn`` processes and a real barrier), and the GPU-only
refusals are exercised where they can be: without a GPU (the real answer here) and, faked, with
fewer GPUs than ranks. On a GPU machine, ``tests/bench/test_bench_cuda.py`` runs two GPUs.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from kvcr_policy.bench import BenchError, BenchSetup, run_bench
from kvcr_policy.bench import targets as bench_targets
from kvcr_policy.bench.rank import RankReport, Step, main, run_rank
from kvcr_policy.bench.ranks import aggregate, run_ranks
from kvcr_policy.bench.resolve import resolve
from kvcr_policy.bench.tp import device_of, parse_devices
from tests.support.commands import run_main

SMALL: dict[str, Any] = dict(geometry="small", tokens=256, repeat=1, exists_keys=1000)


def _lockstep(setup: BenchSetup) -> list[RankReport]:
    """Every rank of ``setup`` in a thread of this process, behind one real barrier (the seam
    that lets the test read each rank's timings; processes are tested below)."""
    barrier = threading.Barrier(setup.ranks, timeout=60)
    reports: dict[int, RankReport] = {}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            reports[r] = run_rank(setup, r, barrier, lambda message: None)
        except BaseException as err:
            barrier.abort()
            errors.append(err)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(setup.ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return [reports[r] for r in range(setup.ranks)]


def test_every_timed_step_starts_only_when_every_rank_is_there() -> None:
    # "default" on both sides: its pipelines leave the interpreter's switch interval alone,
    # which two pipelines opening and closing in threads of one process would race on.
    setup = BenchSetup("default", "default", **SMALL, ranks=4)
    reports = _lockstep(setup)
    steps = [list(report.steps) for report in reports]
    assert len({len(s) for s in steps}) == 1  # the same steps on every rank, in the same order
    moments = list(zip(*steps, strict=True))
    for moment in moments:
        assert len({(s.kind, s.repeat, s.order, s.side) for s in moment}) == 1
    kinds = [s.kind for s in steps[0]]  # a host copy before each store, the store's limit
    # before P's (one for both sides), both limits before each restore
    stores = ["host_copy", "store_limit", "store", "host_copy", "store"]
    assert kinds == stores + ["limit", "host_copy", "restore"] * 4
    for before, after in itertools.pairwise(moments):
        # the barrier: no rank starts a step before every rank ended the one before it
        assert min(s.start for s in after) >= max(s.end for s in before)
    assert all(s.ok for report in reports for s in report.steps)
    result = aggregate(resolve(setup), reports, {"P": 1.0, "Q": 1.0})
    data = result.to_dict()
    assert data["ranks"] == 4 and data["verified"] is True
    assert [r["side"] for r in data["runs"]] == ["P", "Q", "Q", "P"]


def _report(
    report: RankReport,
    restore: tuple[float, float],
    limit: tuple[float, float],
    copy: tuple[float, float] = (0.0, 0.25),
) -> Any:
    """``report`` with one restore of side P (and its two limits) at the given times, 1 GB
    each; its stores and the host copies before them as taken."""
    steps = [s for s in report.steps if s.repeat < 0] + [
        Step("limit", 0, "P,Q", "P", *limit, 10**9, True),
        Step("host_copy", 0, "P,Q", "P", *copy, 10**9, True),
        Step("restore", 0, "P,Q", "P", *restore, 10**9, True),
        Step("limit", 0, "P,Q", "Q", *limit, 10**9, True),
        Step("host_copy", 0, "P,Q", "Q", *copy, 10**9, True),
        Step("restore", 0, "P,Q", "Q", *restore, 10**9, True),
    ]
    return dataclasses.replace(report, steps=tuple(steps))


def test_the_aggregate_spans_from_the_first_start_to_the_last_end() -> None:
    setup = BenchSetup("default", "default", **SMALL, ranks=2)
    plan = resolve(setup)
    zero, one = _lockstep(setup)
    # Rank 1 starts late and runs longer: 2 GB from t=0 to t=2 is 1 GB/s, not 1 + 0.67.
    reports = [
        _report(zero, (0.0, 1.0), (0.0, 0.5)),
        _report(one, (0.5, 2.0), (0.0, 0.5), (0.0, 0.2)),
    ]
    data = aggregate(plan, reports, {}).to_dict()
    assert data["aggregate_gigabytes_per_s"] == data["restore_gigabytes_per_s"] == 1.0
    assert data["limit_gigabytes_per_s"] == 4.0  # 2 GB from 0 to 0.5 s
    assert data["aggregate_ratio_to_limit"] == 0.25
    assert data["host_copy_limit_gigabytes_per_s"] == 8.0  # 2 GB from 0 to 0.25 s
    assert data["aggregate_ratio_to_host_copy_limit"] == data["ratio_to_host_copy_limit"] == 0.125
    assert data["start_skew_ms"] == 500.0
    assert [r["restore_gigabytes_per_s"] for r in data["per_rank"]] == [1.0, 0.667]
    assert [r["ratio_to_limit"] for r in data["per_rank"]] == [0.5, 0.333]
    assert [r["host_copy_limit_gigabytes_per_s"] for r in data["per_rank"]] == [4.0, 5.0]
    assert [r["ratio_to_host_copy_limit"] for r in data["per_rank"]] == [0.25, 0.133]
    assert data["store_host_copy_limit_gigabytes_per_s"] > 0  # the real one, before each store
    # The store's limit, every rank's move into its empty tier at once, before each store.
    assert data["store_limit_gigabytes_per_s"] > 0 and data["store_ratio_to_limit"] > 0
    assert data["store_limit"].startswith("every rank's move of min(4 GiB, its shard), pool ->")


@pytest.mark.slow
def test_two_rank_processes_restore_their_shards_at_once() -> None:
    data = run_bench(BenchSetup("throughput", "default", **SMALL, ranks=2)).to_dict()
    assert data["verified"] is True and data["ranks"] == 2
    shard = 256 * 32 * 1024 // 2  # small: 32 KiB per token, 4 of its 8 KV heads per rank
    assert (data["rank_bytes"], data["bytes"]) == (shard, 2 * shard)
    assert data["shard"] == {"kv_heads": 8, "kv_heads_per_rank": 4, "replicated": False}
    assert [r["side"] for r in data["runs"]] == ["P", "Q", "Q", "P"]
    assert data["aggregate_gigabytes_per_s"] == data["restore_gigabytes_per_s"] > 0
    assert data["aggregate_ratio_to_host_copy_limit"] == data["ratio_to_host_copy_limit"] > 0
    assert data["aggregate_ratio_to_limit"] == data["ratio_to_limit"] > 0
    assert set(data["orders"]) == {"P,Q", "Q,P"}
    ranks = data["per_rank"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["verified"] for r in ranks)
    assert all(len(r["runs"]) == 4 and r["bytes"] == shard for r in ranks)
    for rank in ranks:  # each rank: a tier of its shard per side, nothing pinned on the host
        assert rank["memory"]["P"]["tier_bytes"] == rank["memory"]["Q"]["tier_bytes"] == shard
        assert rank["memory"]["total"] == {
            "tier_bytes": 2 * shard, "pinned_bytes": 0, "registration_s": 0.0
        }  # fmt: skip
        assert set(rank["placement"]) == {"P", "Q"} and rank["placement"]["P"]["pages_per_node"]
    assert data["host"]["tier_bytes"] == 4 * shard  # 2 ranks x 2 sides
    assert data["descriptors"]["P"]["after"] < data["descriptors"]["P"]["before"]


def fails_on_rank_1(setup: BenchSetup, rank: int, barrier: Any, conn: Any) -> None:
    """A rank entry whose rank 1 asks for a profile that does not exist."""
    if rank == 1:
        setup = dataclasses.replace(setup, profile="no-such-profile")
    main(setup, rank, barrier, conn)


def dies_on_rank_1(setup: BenchSetup, rank: int, barrier: Any, conn: Any) -> None:
    """A rank entry whose rank 1 exits at once, saying nothing (killed, out of memory)."""
    if rank == 1:
        os._exit(3)
    main(setup, rank, barrier, conn)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (fails_on_rank_1, "(?s)rank 1 of 2: .*no-such-profile"),
        (dies_on_rank_1, r"rank 1 of 2: the rank process ended \(exit code 3\) before it reported"),
    ],
)
def test_a_failing_rank_stops_every_rank_and_names_itself(entry: Any, message: str) -> None:
    plan = resolve(BenchSetup("default", "default", **SMALL, ranks=2))
    said: list[str] = []
    with pytest.raises(BenchError, match=message):
        run_ranks(plan, said.append, entry=entry)
    assert all("metadata" not in text for text in said)  # stopped before anything else ran


# --- refused before anything starts (exit 2) --------------------------------------------------


def _bench(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code, _, err = run_main(capsys, "bench", "--geometry", "small", "--tokens", "256", *args)
    return code, err


def test_heads_that_do_not_split_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _bench(capsys, "--ranks", "3")
    assert code == 2 and "--ranks 3: 'small' has 8 KV heads" in err


def test_a_gpu_run_without_a_gpu_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    code, err = _bench(capsys, "--target", "cuda", "--ranks", "2")
    assert code == 2 and "no CUDA device visible" in err


def test_more_ranks_than_gpus_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faked: torch sees two GPUs (this host has none), so four ranks are refused."""
    gpus = SimpleNamespace(cuda=SimpleNamespace(device_count=lambda: 2))
    monkeypatch.setattr(bench_targets.CudaTarget, "_torch", lambda self: gpus)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    code, err = _bench(capsys, "--target", "cuda", "--ranks", "4")
    assert code == 2
    assert "--ranks 4: one rank runs per GPU, and 2 CUDA devices are visible" in err
    assert "(CUDA_VISIBLE_DEVICES='0,1'); use --ranks 2 or fewer" in err


def test_ranks_need_a_dram_tier_and_a_profile_comparison(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = _bench(capsys, "--ranks", "2", "--peer", "hicache-file")
    assert code == 2 and "--peer hicache-file runs in one process" in err
    code, err = _bench(capsys, "--ranks", "2", "--backend", "peer")
    assert code == 2 and "backend 'peer' is not supported with --ranks: use --backend dram" in err


def test_ranks_zero_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _bench(capsys, "--ranks", "0")
    assert code == 2 and "--ranks" in err


def test_devices_name_one_gpu_per_rank(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _bench(capsys, "--target", "cuda", "--ranks", "2", "--devices", "0,0,1")
    assert code == 2
    assert "--devices 0,0,1: names 3 GPUs for --ranks 2; give one index per rank" in err
    code, err = _bench(capsys, "--target", "cuda", "--ranks", "2", "--devices", "0,gpu1")
    assert code == 2 and "expected GPU indices separated by commas" in err and "'gpu1'" in err
    code, err = _bench(capsys, "--ranks", "2", "--devices", "0,0")
    assert code == 2 and "--devices maps ranks to GPUs; the cpu target has none" in err


def test_devices_past_the_visible_gpus_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Faked: torch sees one GPU (this host has none): 0,1 names a GPU that is not there."""
    gpus = SimpleNamespace(cuda=SimpleNamespace(device_count=lambda: 1))
    monkeypatch.setattr(bench_targets.CudaTarget, "_torch", lambda self: gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    code, err = _bench(capsys, "--target", "cuda", "--ranks", "2", "--devices", "0,1")
    assert code == 2
    assert "--devices 0,1: GPU 1 is not visible; 1 CUDA device is visible; use indices 0..0" in err


def test_devices_map_ranks_and_may_share_a_gpu() -> None:
    """Two ranks on one GPU pass the check (faked: one GPU visible) and map to it."""
    one = SimpleNamespace(cuda=SimpleNamespace(device_count=lambda: 1))
    target = bench_targets.CudaTarget()
    target._torch = lambda: one  # type: ignore[method-assign]
    target.check_ranks(2, (0, 0))
    with pytest.raises(BenchError, match="one rank runs per GPU"):
        target.check_ranks(2)
    setup = BenchSetup(ranks=2, target="cuda", devices=parse_devices("0, 0", 2))
    assert [device_of(setup, rank) for rank in range(2)] == [0, 0]
    assert [device_of(BenchSetup(ranks=2), rank) for rank in range(2)] == [0, 1]
    assert parse_devices(None, 4) is None
