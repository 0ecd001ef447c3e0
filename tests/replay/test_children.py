"""An engine run's own processes end with it (real processes, real signals)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from kvcr_policy.replay import children

# A run that starts a process of its own (as vLLM starts its engine core) and fails.
FAILING_RUN = (
    "import subprocess, sys; "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "print(p.pid, flush=True); sys.exit(3)"
)


def _gone(pid: int) -> bool:
    """No such process, or a zombie waiting for its (new) parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_what_a_failed_run_started_is_ended_with_it() -> None:
    proc = children.start([sys.executable, "-c", FAILING_RUN], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    orphan = int(proc.stdout.readline())
    proc.wait()  # the run is over; what it started runs on without us
    assert proc.returncode == 3 and not _gone(orphan)
    children.end(proc)
    deadline = time.monotonic() + 60  # SIGKILL is delivered at once; a busy host is slow
    while not _gone(orphan) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(orphan)
    assert proc.returncode == 3  # the run's own status is kept


def test_ending_a_group_that_is_already_gone_is_harmless() -> None:
    proc = children.start([sys.executable, "-c", "pass"])
    proc.wait()
    children.end(proc)
    children.end(proc)
    assert proc.returncode == 0
