"""``kvcr-policy tune`` end to end: the command on the real runner (short budgets, tiny
geometry), and its decisions on chosen rates.

Speed is never asserted, and no decision rests on a measurement of the moment: on a busy
machine the spread of real repeats swallows any win a test could force. The real runs check
only what holds whatever the machine does (the budget's stopping rule, the shape of the
result); whether the command writes, re-checks and rejects is tested with a bench that answers
rates the test chose (:func:`tests.tune.measured.install`): a clear win, a win inside the
spread, a win that no longer holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy import load_config
from tests.support.commands import run_command, run_main
from tests.tune.measured import install

pytestmark = pytest.mark.usefixtures("clean_env")

TINY = ["--geometry", "small", "--tokens", "256"]


def tune_in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any, str]:
    code, out, err = run_main(capsys, "tune", *TINY, *args, "--format", "json")
    return code, json.loads(out) if out.strip() else None, err


def test_a_short_real_tune_finishes_within_its_budget(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "site.toml"
    code, data, err = tune_in_process(capsys, "--budget", "10", "--output", str(target))
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


def bigger_batches(config: Any, order: str) -> float:
    return 1.0 + config.batching.read_batch_pages / 256


def smaller_batches(config: Any, order: str) -> float:
    return 10.0 - config.batching.read_batch_pages / 256


def test_a_clear_win_is_written_rechecked_and_caught_when_it_no_longer_wins(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    write_profile: Callable[..., Path],
    tmp_path: Path,
) -> None:
    start = write_profile('[profile]\nbase = "throughput"\n[batching]\nread_batch_pages = 1\n')
    target = tmp_path / "site.toml"
    install(monkeypatch, bigger_batches)
    code, data, err = tune_in_process(
        capsys,
        *("--profile", str(start), "--only", "batching.read_batch_pages"),
        *("--budget", "30", "--repeat", "5", "--output", str(target)),
    )
    assert code == 0, err
    assert data["verdict"]["wins"] is True, data["message"]
    loaded = load_config(profile=target, dotenv=False)
    assert loaded.config.batching.read_batch_pages == 2048  # the best candidate
    assert loaded.origin("batching.read_batch_pages") == f"profile {target} [batching]"
    assert loaded.bases[0] == str(start)
    text = target.read_text()
    assert text.count("  order ") == 2 and "# command: kvcr-policy tune --profile" in text

    code, data, err = tune_in_process(capsys, "--remeasure", str(target), "--repeat", "3")
    assert code == 0 and data["verdict"]["wins"] is True, err

    install(monkeypatch, smaller_batches)  # now large batches are the slow ones
    # --check: the former name of --remeasure, kept as a hidden alias
    code, data, err = tune_in_process(capsys, "--check", str(target), "--repeat", "3")
    assert code == 1
    assert data["message"].startswith(f"{target} no longer wins: order ")
    assert "%" in data["message"]


def test_a_win_within_the_spread_of_the_repeats_is_not_written(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    write_profile: Callable[..., Path],
    tmp_path: Path,
) -> None:
    start = write_profile('[profile]\nbase = "throughput"\n[batching]\nread_batch_pages = 1\n')
    target = tmp_path / "site.toml"
    # 2 % faster at best, while the repeats scatter by 10 % either way.
    install(monkeypatch, lambda config, order: 1.0 + 0.02 * (config.batching.read_batch_pages > 1),
            jitter=0.1)  # fmt: skip
    code, data, err = tune_in_process(
        capsys,
        *("--from", str(start), "--only", "batching.read_batch_pages"),
        *("--budget", "30", "--repeat", "5", "--write", str(target)),
    )
    assert code == 0, err
    assert data["verdict"]["wins"] is False
    assert "within the spread of the repeats" in data["message"], data["message"]
    assert not target.exists() and data["written"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--only", "batching.nope"], "--only names no tunable knob"),
        (["--budget", "0"], "expected a finite number from 1 to 604800 s, got '0'"),
        (["--budget", "nan"], "expected a finite number from 1 to 604800 s, got 'nan'"),
        (["--repeat", "2"], "a confirmation needs at least 3 repeats"),
        (["--from", "nope"], "no bundled profile or file named 'nope'"),
        (["--tokens", "100"], "try --tokens 96"),
        (["--remeasure", "missing.toml"], "--remeasure: no profile file at missing.toml"),
        (["--check", "missing.toml"], "--remeasure: no profile file at missing.toml"),
        (["--remeasure", "x.toml", "--output", "y.toml"], "it writes nothing: drop --output"),
        (["--check", "x.toml", "--write", "y.toml"], "it writes nothing: drop --output"),
        (["--output", "a.toml", "--write", "b.toml"], "--write is the former name of --output"),
        (["--remeasure", "a.toml", "--check", "b.toml"], "give --remeasure once"),
    ],
)
def test_bad_input_exits_2_before_anything_runs(args: list[str], message: str) -> None:
    done = run_command("tune", *TINY, *args, timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_check_refuses_a_profile_without_a_base(write_profile: Callable[..., Path]) -> None:
    path = write_profile("[batching]\nread_batch_pages = 64\n")
    done = run_command("tune", "--remeasure", str(path), timeout=120)
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
    monkeypatch: pytest.MonkeyPatch,
    example_plugin: None,
    write_profile: Callable[..., Path],
    tmp_path: Path,
) -> None:
    # The example plugin's `adaptive` batching aims each batch at target_batch_bytes; on the
    # chosen rates, larger targets restore faster.
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
    install(
        monkeypatch,
        lambda config, order: 1.0 + config.batching.options["target_batch_bytes"] / (64 << 20),
    )
    code, data, err = tune_in_process(
        capsys,
        *("--from", str(start), "--only", "batching.options.target_batch_bytes"),
        *("--budget", "30", "--repeat", "5", "--write", str(target)),
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


def test_help_names_the_new_spellings_only(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "tune", "--help")
    assert code == 0
    for name in ("--output", "--output-always", "--remeasure"):
        assert name in out
    for former in ("--write", "--always-write", "--check "):
        assert former not in out  # hidden aliases


@pytest.mark.parametrize("flag", ["--output-always", "--always-write"])
def test_output_always_writes_the_best_candidate_even_when_it_loses(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    write_profile: Callable[..., Path],
    tmp_path: Path,
    flag: str,
) -> None:
    """docs/bench.md's ``--output site.toml --output-always`` (and its hidden former name):
    the candidate is written though the base stands, and the file records the flag."""
    start = write_profile('[profile]\nbase = "throughput"\n[batching]\nread_batch_pages = 1\n')
    target = tmp_path / "site.toml"
    install(monkeypatch, lambda config, order: 10.0 - config.batching.read_batch_pages / 256)
    code, data, err = tune_in_process(
        capsys,
        *("--profile", str(start), "--only", "batching.read_batch_pages"),
        *("--budget", "30", "--repeat", "5", "--output", str(target), flag),
    )
    assert code == 0, err
    assert data["verdict"]["wins"] is False and data["written"] == str(target)
    load_config(profile=target, dotenv=False)
    assert "--output-always" in target.read_text()
