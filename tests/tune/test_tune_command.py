"""``kvcr-policy tune`` end to end on the real runner: short budgets, tiny geometry.

Speed is never asserted. The forced win makes the start slower by construction (each copy call
costs a few milliseconds more and the start issues one call per page), so that whether the
decision path writes, re-checks and rejects can be tested on a shared machine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy import load_config
from kvcr_policy.backends.dram.transports.cpu import CpuTransport
from tests.support.commands import run_command, run_main

pytestmark = pytest.mark.usefixtures("clean_env")

TINY = ["--geometry", "small", "--tokens", "256"]


def tune_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code, out, err = run_main(capsys, "tune", *TINY, *args, "--format", "json")
    return code, json.loads(out) if out.strip() else None, err


def test_a_short_real_tune_finishes_within_its_budget(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "site.toml"
    code, data, err = tune_in_process(capsys, "--budget", "10", "--write", str(target))
    assert code == 0, err
    assert data["trials"] and data["verdict"]["verified"] is True
    # The stopping rule, not the wall clock (a busy CI core slows any trial): a trial after the
    # first starts only while it and the confirmation fit, estimated from the slowest trial so
    # far (repeat 9 / trial_repeat 3 = 3 trials' worth), so the time the earlier trials took is
    # a lower bound on the clock at that decision.
    seconds = [trial["seconds"] for trial in data["trials"]]
    for k in range(1, len(seconds)):
        assert sum(seconds[:k]) + max(seconds[:k]) * (1 + 9 / 3) <= 10, seconds
    assert data["confirmation"]["repeat"] >= 3
    assert "trial 0:" in err  # one line per trial when stderr is not a terminal
    assert set(data["verdict"]["orders"]) == {"P,Q", "Q,P"}
    if data["verdict"]["wins"]:
        assert data["written"] == str(target)
        load_config(profile=target, dotenv=False)
    else:
        assert not target.exists() and "'throughput' stands" in data["message"]


@pytest.fixture
def slow_small_batches(monkeypatch: pytest.MonkeyPatch) -> Callable[[bool], None]:
    """Each copy call costs 3 ms more (``big=False``: small batches lose), or each call
    larger than 1 MiB costs 50 ms more (``big=True``: large batches lose)."""
    real = CpuTransport.copy

    def choose(big: bool) -> None:
        def lagging(self: CpuTransport, batch: Any) -> None:
            nbytes = batch.descriptors.nbytes
            if (nbytes > 1 << 20) if big else True:
                time.sleep(0.05 if big else 0.003)
            real(self, batch)

        monkeypatch.setattr(CpuTransport, "copy", lagging)

    return choose


def test_a_real_win_is_written_rechecked_and_caught_when_it_no_longer_wins(
    capsys: pytest.CaptureFixture[str],
    write_profile: Callable[..., Path],
    slow_small_batches: Callable[[bool], None],
    tmp_path: Path,
) -> None:
    start = write_profile('[profile]\nbase = "throughput"\n[batching]\nread_batch_pages = 1\n')
    target = tmp_path / "site.toml"
    slow_small_batches(False)
    code, data, err = tune_in_process(
        capsys,
        *("--from", str(start), "--only", "batching.read_batch_pages"),
        *("--budget", "12", "--repeat", "5", "--write", str(target)),
    )
    assert code == 0, err
    assert data["verdict"]["wins"] is True, data["message"]
    loaded = load_config(profile=target, dotenv=False)
    assert loaded.config.batching.read_batch_pages >= 32
    assert loaded.origin("batching.read_batch_pages") == f"profile {target} [batching]"
    assert loaded.bases[0] == str(start)
    text = target.read_text()
    assert text.count("  order ") == 2 and "# command: kvcr-policy tune --from" in text

    code, data, err = tune_in_process(capsys, "--check", str(target), "--repeat", "3")
    assert code == 0 and data["verdict"]["wins"] is True, err

    slow_small_batches(True)  # now large batches are the slow ones: the tuned profile loses
    code, data, err = tune_in_process(capsys, "--check", str(target), "--repeat", "3")
    assert code == 1
    assert data["message"].startswith(f"{target} no longer wins: order ")
    assert "%" in data["message"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--only", "batching.nope"], "--only names no tunable knob"),
        (["--budget", "0"], "--budget: expected seconds > 0"),
        (["--repeat", "2"], "a confirmation needs at least 3 repeats"),
        (["--from", "nope"], "no bundled profile or file named 'nope'"),
        (["--tokens", "100"], "try --tokens 96"),
        (["--check", "missing.toml"], "--check: no profile file at missing.toml"),
        (["--check", "x.toml", "--write", "y.toml"], "it writes nothing: drop --write"),
    ],
)
def test_bad_input_exits_2_before_anything_runs(args: list[str], message: str) -> None:
    done = run_command("tune", *TINY, *args, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_check_refuses_a_profile_without_a_base(write_profile: Callable[..., Path]) -> None:
    path = write_profile("[batching]\nread_batch_pages = 64\n")
    done = run_command("tune", "--check", str(path), timeout=120)
    assert done.returncode == 2 and "names no base profile" in done.stderr


def test_cuda_target_without_a_gpu_exits_2_with_a_clear_message() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible here")
    done = run_command(
        "tune", "--target", "cuda", "--geometry", "small", "--tokens", "64", timeout=120
    )
    assert done.returncode == 2
    assert "no CUDA device visible" in done.stderr and "Traceback" not in done.stderr


def test_a_third_party_option_is_tuned_and_written_like_a_built_in(
    capsys: pytest.CaptureFixture[str],
    example_plugin: None,
    write_profile: Callable[..., Path],
    slow_small_batches: Callable[[bool], None],
    tmp_path: Path,
) -> None:
    # The example plugin's `adaptive` batching aims each batch at target_batch_bytes: one
    # 512 KiB page a batch to start with, so every page pays the injected per-call cost.
    start = write_profile(
        """
        [profile]
        base = "throughput"
        [batching]
        strategy = "adaptive"
        [batching.options]
        page_bytes = "512KiB"
        target_batch_bytes = "512KiB"
        """
    )
    target = tmp_path / "site.toml"
    slow_small_batches(False)
    code, data, err = tune_in_process(
        capsys,
        *("--from", str(start), "--only", "batching.options.target_batch_bytes"),
        *("--budget", "12", "--repeat", "5", "--write", str(target)),
    )
    assert code == 0, err
    assert data["knobs"] == ["batching.options.target_batch_bytes"]
    assert data["verdict"]["wins"] is True, data["message"]
    loaded = load_config(profile=target, dotenv=False)
    assert loaded.config.batching.strategy == "adaptive"
    assert loaded.config.batching.options["target_batch_bytes"] >= 4 << 20
    origin = loaded.origin("batching.options.target_batch_bytes")
    assert origin == f"profile {target} [batching.options]"
    assert loaded.origin("batching.options.page_bytes") == f"profile {start} [batching.options]"
