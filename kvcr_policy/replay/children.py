"""Engine runs in process groups of their own.

An engine run (``vllm_run``, ``sglang_run``) starts processes of its own: vLLM's engine core
and workers, SGLang's scheduler. When the run fails, or is killed at its deadline, those are
orphaned and go on spinning (vLLM's workers poll their message queue), taking the CPU from the
runs that follow. Each run is therefore started as the leader of a new process group
(:func:`start`), and :func:`end` kills what is left of that group once the run is over,
whatever its status. The host tier is not among them: it starts a session of its own and
outlives the run that started it (until its idle exit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any

__all__ = ["end", "start"]


def start(command: list[str], **options: Any) -> subprocess.Popen[str]:
    """``command`` as a process group of its own (``options`` as :class:`subprocess.Popen`'s)."""
    return subprocess.Popen(command, start_new_session=True, text=True, **options)


def end(proc: subprocess.Popen[str]) -> None:
    """Kill whatever is left of ``proc``'s process group (``proc`` too, if it still runs) and
    reap ``proc``."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
