"""Child processes that speak in lines: read the next one, or wait for a marker they print.

A test that kills or signals a child waits first for the child's own word that it reached the
point in question (``ready``, ``restoring``, a JSON line), never for a guessed time. Reads run in
a helper thread so that a silent child fails the test after ``timeout`` instead of hanging it.
"""

from __future__ import annotations

import subprocess
import threading
from typing import IO

import pytest

__all__ = ["next_line", "wait_for_line"]


def next_line(proc: subprocess.Popen[str], *, stream: str = "stdout", timeout: float = 60.0) -> str:
    """The child's next line on ``stream`` (``stdout`` or ``stderr``), without its newline.

    Fails the test if the child closes the stream first (saying how it exited) or prints
    nothing within ``timeout`` seconds.
    """
    pipe: IO[str] | None = getattr(proc, stream)
    assert pipe is not None, f"the child's {stream} is not a pipe"
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(pipe.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not got:
        pytest.fail(f"the child printed no line on {stream} within {timeout:g} s")
    if not got[0]:
        pytest.fail(f"the child closed its {stream} (exit code {proc.wait(10)})")
    return got[0].rstrip("\n")


def wait_for_line(proc: subprocess.Popen[str], line: str, *, timeout: float = 60.0) -> None:
    """Read the child's stdout until a line equal to ``line`` (surrounding blanks ignored);
    other lines are skipped. Fails like :func:`next_line`, each line within ``timeout``."""
    while next_line(proc, timeout=timeout).strip() != line:
        pass
