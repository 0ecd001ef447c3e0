"""Tests for kvcr_policy.bench.progress: off a terminal, a line per step and never a long
silence; through the CLI, the verdict comes first on stdout and the steps on stderr."""

from __future__ import annotations

import io
import json

from kvcr_policy.bench.progress import EVERY_S, Lines
from tests.support.commands import run_command
from tests.support.waiting import wait_until


def test_a_line_per_step_then_one_while_a_step_lasts() -> None:
    stream = io.StringIO()
    with Lines(2, stream=stream, every=0.05) as say:
        say("P: storing 16 pages")
        wait_until(lambda: "still on: P: storing 16 pages" in stream.getvalue(), "a beat", 30)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("bench [1/2 ") and lines[0].endswith("] P: storing 16 pages")
    assert all(line.startswith("bench [1/2 ") for line in lines)
    assert EVERY_S <= 10  # the promise: a sign of life at least every 10 s


def test_a_finished_run_stops_its_clock() -> None:
    stream = io.StringIO()
    lines = Lines(1, stream=stream, every=0.01)
    with lines as say:
        say("done")
    assert not lines._thread.is_alive()


def test_off_a_terminal_bench_says_its_steps_and_its_verdict_first() -> None:
    small = ["--geometry", "small", "--tokens", "256", "--repeat", "1"]
    done = run_command("bench", *small)  # stdout and stderr are pipes here
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("throughput vs default: restore ") and " of the limit (" in first
    assert " of this host's memory copy (" in first, first
    assert first.endswith("default; every byte verified"), first
    assert "P = throughput, Q = default" in done.stdout
    lines = [line for line in done.stderr.splitlines() if line.startswith("bench [")]
    steps = [line for line in lines if "] still on: " not in line]  # beats come on a busy host
    assert steps and steps[-1].startswith(f"bench [{len(steps)}/{len(steps)} "), done.stderr
    data = json.loads(run_command("bench", *small, "--format", "json").stdout)
    assert data["verdict"].startswith("throughput vs default: restore ")
