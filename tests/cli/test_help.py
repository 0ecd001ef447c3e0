"""Tests for kvcr_policy.cli.help: every command's help at 80 columns, and ``--version``.

Each help is rendered through the console entry point (``kvcr_policy.cli.main``) exactly as a
user at an 80-column terminal sees it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from importlib.metadata import version
from typing import Any

import pytest
import typer

from kvcr_policy.cli import app

Run = Callable[..., tuple[int, str, str]]

pytestmark = pytest.mark.usefixtures("clean_env")

#: What typer prints when it names a Python type instead of a value.
PYTHON_TYPES = re.compile(r"<(str|int|float|bool|path|list\[[^>]*\]|int range|float range)>")


def _commands() -> Iterator[list[str]]:
    def walk(command: Any, path: list[str]) -> Iterator[list[str]]:
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


COMMANDS = list(_commands())


def test_every_command_is_walked() -> None:
    names = {" ".join(path) for path in COMMANDS}
    assert {"", "bench", "tune", "validate", "plan", "serve"} <= names


@pytest.mark.parametrize("path", COMMANDS, ids=lambda path: " ".join(path) or "root")
def test_help_fits_80_columns_names_values_and_lists_choices(
    cli: Run, monkeypatch: pytest.MonkeyPatch, path: list[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    status, out, err = cli(*path, "--help")
    assert status == 0, err
    too_long = [line for line in out.splitlines() if len(line) > 80]
    assert not too_long, too_long
    assert "…" not in out, out  # a word cut short cannot be copied
    assert not PYTHON_TYPES.search(out), out
    if path in (["bench"], ["tune"]):
        assert "<cpu|cuda>" in out  # choices are listed
        assert "KEY=VALUE" in out and "PROFILE" in out


def test_layout_help_lists_every_layout() -> None:
    from kvcr_policy.cli.options import LAYOUT_HELP
    from kvcr_policy.geometry import LAYOUTS

    assert ", ".join(LAYOUTS[:-1]) + f" or {LAYOUTS[-1]}." == LAYOUT_HELP


def test_version_prints_the_installed_version(cli: Run) -> None:
    status, out, err = cli("--version")
    assert (status, err) == (0, "")
    assert out == f"kvcr-policy {version('kvcr-policy')}\n"
