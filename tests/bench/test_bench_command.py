"""``kvcr-policy bench`` itself: exit codes, the screen, the JSON keys, inputs checked first."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.bench.backends import bench_backends
from kvcr_policy.cli import figure as figure_path
from tests.support.commands import run_command, run_main

SMALL = ["--geometry", "small", "--tokens", "256", "--repeat", "1"]
# Every key docs/bench.md's Benchmark section documents.
README_KEYS = (
    "bytes", "verified", "limit_gigabytes_per_s", "restore_gigabytes_per_s",
    "baseline_gigabytes_per_s", "ratio_to_limit", "host_copy_limit_gigabytes_per_s",
    "ratio_to_host_copy_limit", "limit", "host_copy_limit", "limit_short",
    "store_host_copy_limit_gigabytes_per_s", "store_ratio_to_host_copy_limit",
    "store_limit_gigabytes_per_s", "store_ratio_to_limit", "store_limit",
    "speedup_vs_baseline", "exists_keys_per_s", "orders", "profiles", "descriptors", "runs",
)  # fmt: skip


def bench_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code, out, _ = run_main(capsys, "bench", *args, "--format", "json")
    return code, json.loads(out) if out else None


def test_json_has_every_documented_key() -> None:
    done = run_command("bench", *SMALL, "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert all(key in data for key in README_KEYS)
    documented = Path(__file__).parents[2].joinpath("docs", "bench.md").read_text()
    assert [key for key in README_KEYS if f"`{key}`" not in documented] == []
    assert data["verified"] is True and data["profiles"]["P"]["name"] == "throughput"


@pytest.fixture
def slow_profile(write_profile: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A profile slower by construction: its transport moves at most 50 MB/s."""
    real = MemoryTransport.copy

    def lagging(self: MemoryTransport, batch: Any) -> None:
        time.sleep(batch.descriptors.nbytes / 50e6)
        real(self, batch)

    monkeypatch.setattr(MemoryTransport, "copy", lagging)
    return str(write_profile('[transport]\nname = "memory"\n', "slow.toml"))


def test_the_screen_rejects_a_slower_profile_in_both_orders(
    slow_profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # 8 MiB at 0.05 GB/s, against a plain copy of several GB/s.
    code, data = bench_in_process(
        capsys, *SMALL, "--profile", slow_profile, "--vs", "default", "--screen", "50"
    )
    assert code == 1
    assert data["verified"] is True
    assert data["screen"] == {"percent": 50.0, "passed": False, "failed_orders": ["P,Q", "Q,P"]}


def test_the_screen_passes_a_faster_profile(
    slow_profile: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = bench_in_process(
        capsys, *SMALL, "--profile", "default", "--vs", slow_profile, "--screen", "50"
    )
    assert code == 0
    assert data["screen"]["passed"] is True and data["speedup_vs_baseline"] > 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--backend", "nope"],
            f"unknown backend 'nope'; expected one of: {', '.join(sorted(bench_backends()))}",
        ),
        (["--transport", "ucx", "--backend", "dram"], "--backend dram contradicts it"),
        (["--screen", "150"], "expected a finite number from 0 to 100 %, got '150'"),
        (["--screen", "100"], "--screen: expected a percent in [0, 100), got 100.0"),
        (["--tokens", "100"], "try --tokens 96"),
        (["--profile", "nope"], "no bundled profile or file named 'nope'"),
    ],
)
def test_bad_input_exits_2_before_anything_runs(args: list[str], message: str) -> None:
    done = run_command("bench", "--geometry", "small", "--tokens", "256", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_plot_is_checked_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(figure_path, "find_spec", lambda name: None)
    code, out, err = run_main(capsys, "bench", *SMALL, "--plot", str(tmp_path / "run.png"))
    assert (code, out) == (2, "")
    assert re.search(r"needs matplotlib.*-e '\.\[plot\]' in the kvcr-policy clone", err)
    monkeypatch.setattr(figure_path, "find_spec", lambda name: object())
    bad = ((tmp_path / "missing" / "run.png", "does not exist"), (tmp_path, "is a folder"))
    for path, says in bad:
        code, out, err = run_main(capsys, "bench", *SMALL, "--plot", str(path))
        assert (code, out) == (2, "")
        assert says in err


def test_cli_plot_into_a_missing_folder_exits_2(tmp_path: Path) -> None:
    done = run_command("bench", *SMALL, "--plot", str(tmp_path / "missing" / "run.png"))
    assert done.returncode == 2
    assert "--plot" in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    target = tmp_path / "run.png"
    done = run_command("bench", *SMALL, "--plot", str(target), "--format", "json")
    assert done.returncode == 0, done.stderr
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cuda_target_without_a_gpu_exits_2_with_a_clear_message() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    done = run_command("bench", "--target", "cuda", "--geometry", "small", "--tokens", "64")
    assert done.returncode == 2
    assert "no CUDA device visible" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_text_output_says_what_the_screen_found_and_where_the_plot_went(
    slow_profile: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    plot = tmp_path / "restore.png"
    code, out, _ = run_main(capsys, "bench", *SMALL, "--profile", "default", "--vs",
                            slow_profile, "--screen", "50", "--plot", str(plot))  # fmt: skip
    assert code == 0 and plot.is_file()
    assert "screen 50 %: passed" in out and f"plot: wrote {plot}" in out
    code, out, _ = run_main(capsys, "bench", *SMALL, "--profile", slow_profile, "--vs",
                            "default", "--screen", "50")  # fmt: skip
    assert code == 1 and "screen 50 %: FAILED in order(s) P,Q, Q,P" in out
