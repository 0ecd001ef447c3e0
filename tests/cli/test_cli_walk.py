"""Small things a new user met: ``validate --set`` as ``show`` takes it, and ``plugins`` off a
terminal (a pipe, CI's log) with every name whole."""

from __future__ import annotations

import json

import pytest

from tests.support.commands import run_command, run_main

pytestmark = pytest.mark.usefixtures("clean_env")


def test_validate_takes_set_as_show_does(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "validate", "throughput", "--set",
                              "placement.capacity_bytes=1GiB", "--format", "json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["ok"] is True
    code, _, err = run_main(capsys, "validate", "throughput", "--set",
                            "placement.capacity_bytes=64Gb")  # fmt: skip
    assert code == 2 and "placement.capacity_bytes (from override)" in err


def test_plugins_off_a_terminal_cuts_no_name() -> None:
    done = run_command("plugins")  # stdout is a pipe: rich's default is 80 columns
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    listed = json.loads(run_command("plugins", "--format", "json").stdout)["strategies"]
    for specs in listed.values():
        for spec in specs:
            assert spec["distribution"] in done.stdout and spec["name"] in done.stdout
            assert spec["description"].split()[0] in done.stdout
