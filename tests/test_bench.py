"""The benchmark: real stores and restores on a small geometry, verified; the screen's logic.

Speed is never asserted here: only that the figures exist, are consistent with each other, and
that every restored byte was checked.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from kvcr_policy.bench import BenchError, BenchSetup, _checksums, run_bench, screen


def test_bench_restores_verified_bytes_with_both_profiles_in_both_orders() -> None:
    result = run_bench(BenchSetup("throughput", "default", "small", "layer_first", 256, 2))
    assert result["verified"] is True
    assert result["bytes"] == 256 * 32 * 1024  # small: 32 KiB per token
    assert {r["order"] for r in result["runs"]} == {"P,Q", "Q,P"}
    assert len(result["runs"]) == 2 * 2 * 2  # repeat x orders x profiles
    assert all(r["verified"] for r in result["runs"])
    # Each restore is compared with the limit measured right before it.
    p_ratios = sorted(r["ratio_to_limit"] for r in result["runs"] if r["side"] == "P")
    assert p_ratios[0] <= result["ratio_to_limit"] <= p_ratios[-1]
    for run in result["runs"]:
        assert run["ratio_to_limit"] == pytest.approx(run["restore_gbps"] / run["limit_gbps"])
    # Coalescing is on in throughput only: fewer descriptors reach its transport.
    assert result["descriptors"]["P"]["after"] < result["descriptors"]["P"]["before"]
    assert result["descriptors"]["Q"]["after"] == result["descriptors"]["Q"]["before"]
    assert result["exists_keys_per_s"] > 0


def test_bench_into_scattered_pages_is_verified_too() -> None:
    result = run_bench(
        BenchSetup("throughput", "default", "small", "page_first", 128, 1, scatter=True)
    )
    assert result["verified"] is True and result["scatter"] is True


def test_checksums_see_a_single_flipped_byte() -> None:
    view = np.zeros((2, 4, 64), dtype=np.uint8)
    before = _checksums(view)
    view[1, 2, 17] = 1
    after = _checksums(view)
    assert (before != after).tolist() == [False, False, True, False]


def test_screen_fails_the_order_where_p_is_more_than_the_margin_below_q() -> None:
    result = {
        "orders": {
            "P,Q": {"restore_gbps": 9.6, "baseline_gbps": 10.0},
            "Q,P": {"restore_gbps": 9.4, "baseline_gbps": 10.0},
        }
    }
    verdict = screen(result, 5)
    assert verdict == {"percent": 5, "passed": False, "failed_orders": ["Q,P"]}
    assert screen(result, 10)["passed"] is True


def test_unknown_geometry_is_a_clear_error() -> None:
    with pytest.raises(BenchError, match="presets: qwen3-32b, small"):
        run_bench(BenchSetup("default", "default", "llama-9000"))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvcr_policy", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_bench_json_and_screen_exit_code() -> None:
    done = run_cli(
        "bench", "--geometry", "small", "--tokens", "128", "--repeat", "1", "--vs", "throughput",
        "--profile", "throughput", "--screen", "99", "--format", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    for key in ("bytes", "verified", "limit_gbps", "restore_gbps", "baseline_gbps",
                "ratio_to_limit", "speedup_vs_baseline", "profiles", "screen"):  # fmt: skip
        assert key in data
    assert data["screen"]["passed"] is True


def test_cli_cuda_target_without_a_gpu_exits_2_with_a_clear_message() -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    done = run_cli("bench", "--target", "cuda", "--tokens", "64")
    assert done.returncode == 2
    assert "no CUDA device visible" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_audit_reports_the_placement_as_json() -> None:
    done = run_cli("audit", "--size", "8MiB", "--format", "json")
    assert done.returncode == 0, done.stderr
    audit = json.loads(done.stdout)["audit"]
    assert audit["bytes"] == 8 << 20
    assert audit["huge_pages_requested"] == "off"
