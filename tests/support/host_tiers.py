"""Host tiers that tests start (backend ``host``): find their processes by their lock files."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from kvcr_policy.backends.peer.host_tier import lock_held

__all__ = ["stop_host_tiers", "tier_pid"]


def tier_pid(lock: Path) -> int | None:
    """The pid a running host tier wrote into its lock file (None: none runs). A tier runs
    while its lock is held: a killed one that nobody reaped (a zombie, where the container's
    init does not reap) has released it."""
    if not lock_held(lock):
        return None
    try:
        text = lock.read_text().strip()
    except OSError:
        return None
    if not text.isdigit():
        return None
    pid = int(text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def stop_host_tiers(folder: Path, timeout: float = 10.0) -> None:
    """SIGTERM every host tier whose lock file is under ``folder``; SIGKILL what is left."""
    pids = [pid for lock in folder.rglob("*.lock") if (pid := tier_pid(lock)) is not None]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
