"""The ``kvcr-policy`` command as the tests run it: in this process, or as a child process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvcr_policy.cli import main

__all__ = ["run_command", "run_main"]


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``kvcr_policy.cli.main(argv)`` in this process (fast, and the console entry point):
    its exit status, stdout and stderr."""
    try:
        main(list(argv))
    except SystemExit as stop:
        code = stop.code
        status = 0 if code is None else code if isinstance(code, int) else 1
    else:
        status = 0
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def run_command(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m kvcr_policy ARGV`` in a child process, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "kvcr_policy", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
