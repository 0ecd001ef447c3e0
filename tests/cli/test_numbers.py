"""Every number the command line takes is bounded and finite (red team 2026-12-b, B3 and B8):
declared bounds on every int and float option of every command, the hostile values refused
with one message naming the option, and `plan` at its largest sizes under an address-space
limit (it once built a list of every batch of the prefix and died of MemoryError)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import typer.main

from kvcr_policy.cli import app
from kvcr_policy.cli.numbers import MAX_DIM, MAX_TOKENS, Finite

Run = Callable[..., tuple[int, str, str]]

pytestmark = pytest.mark.usefixtures("clean_env")

#: Values no number option may take: not finite, or far past any sane bound either way.
HOSTILE = ("nan", "inf", "-inf", "1e400", "1" + "0" * 30, "-1" + "0" * 30, "1e-300")


def _numbers() -> Iterator[tuple[str, str, Any]]:
    """(command path, option, its typer parameter) of every int or float option."""

    def walk(command: Any, path: list[str]) -> Iterator[tuple[str, str, Any]]:
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])
        for param in command.params:
            described = getattr(param, "type_descriptor", None)
            if described is not None and described.annotation in (int, float):
                yield " ".join(path), param.opts[0], param

    yield from walk(typer.main.get_command(app), [])


NUMBERS = list(_numbers())


def test_every_number_option_declares_both_bounds() -> None:
    assert len(NUMBERS) >= 24, [f"{c} {o}" for c, o, _ in NUMBERS]
    for command, option, param in NUMBERS:
        info = param.type_descriptor.parameter_info
        where = f"kvcr-policy {command} {option}"
        if param.type_descriptor.annotation is float:
            assert isinstance(info.parser, Finite), f"{where}: parse it with cli.numbers.Finite"
        else:
            assert param.min is not None and param.max is not None, f"{where}: give min and max"


@pytest.mark.parametrize(("command", "option"), [(c, o) for c, o, _ in NUMBERS])
def test_hostile_numbers_are_refused_naming_the_option(cli: Run, command: str, option: str) -> None:
    for value in HOSTILE:
        if value == "1e-300" and option in ("--grace", "--metrics-hold", "--screen"):
            continue  # 0 is a valid value there (no grace, no hold, no screen), so is 1e-300
        code, _, err = cli(*command.split(), option, value)
        assert code == 2, (option, value, err)
        assert option in err and "Traceback" not in err, (option, value, err)


PLAN_AT_ITS_LARGEST = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 31, 1 << 31))
from kvcr_policy.cli import main
sys.argv = ["kvcr-policy", "plan", "--geometry", "small", "--format", "json", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--tokens", str(MAX_TOKENS)],
        ["--tokens", str(MAX_TOKENS), "--page-size", "1", "--set", "batching.read_batch_pages=1"],
        ["--tokens", str(MAX_TOKENS), "--set", "batching.window_bytes=1TiB"],
    ],
    ids=["default", "one-page-batches", "window"],
)
def test_plan_at_its_largest_counts_batches_in_bounded_memory(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PLAN_AT_ITS_LARGEST, *args],
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard: the plan is arithmetic, it takes a second
        env={k: v for k, v in os.environ.items() if not k.startswith("KVCR_POLICY_")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"batches"' in done.stdout


def test_plan_dimensions_past_any_tier_are_refused_with_one_message(cli: Run) -> None:
    big = str(MAX_DIM)
    dims = ("--layers", big, "--heads", big, "--head-dim", big, "--page-size", big)
    code, out, err = cli("plan", "--geometry", "small", "--tokens", "8192", *dims)
    assert code == 2 and "Traceback" not in err, err
    assert "more than the 256TiB any tier may hold" in err
    assert "the option wins" in out  # each dimension that replaced the preset's says so


def test_a_prefix_longer_than_the_tier_is_refused(cli: Run) -> None:
    code, _, err = cli("plan", "--geometry", "small", "--tokens", "8192", "--prefix-tokens", "9000")
    assert code == 2 and "--prefix-tokens 9000 is more than the 8192 tokens" in err, err
