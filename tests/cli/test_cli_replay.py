"""``kvcr-policy replay`` on the command line: a bad value exits 2 with one message."""

from __future__ import annotations

import subprocess
import sys

from tests.support.paths import ROOT, child_env


def run(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kvcr_policy", "replay", *args]
    return subprocess.run(
        command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120, check=False
    )


def test_a_missing_trace_exits_2_naming_the_bundled_ones() -> None:
    done = run("--engine", "sglang", "--trace", "no/such.jsonl.xz")
    assert done.returncode == 2
    assert "is not a file" in done.stderr and "data/traces/" in done.stderr
    assert "Traceback" not in done.stderr


def test_vllm_at_tp_2_exits_2_with_the_fix() -> None:
    done = run("--engine", "vllm", "--tp", "2")
    assert done.returncode == 2 and "drop --tp and --mla" in done.stderr


def test_a_bad_override_exits_2_before_any_engine_starts() -> None:
    done = run("--engine", "sglang", "--set", "novalue")
    assert done.returncode == 2 and "expected KEY=VALUE" in done.stderr
