"""Where the threads and processes kvcr_policy starts run: on every CPU of the process.

A thread starts with the CPU affinity of the thread that starts it, and a process with that of
the thread that forks it. Engines pin their compute threads, one CPU each: vLLM's CPU worker
pins its main thread (the one that then builds the connector) to one core, and between steps
that thread busy-polls its message queue (``sched_yield``) until the scheduler sends the next
step. Started from it, the peer's event loop, the connector's load and save threads and the
host tier's process would all share that one core with the poller, while the scheduler (in a
process of its own) waits for the host tier to answer its lookups before it sends that step.
On a loaded 2-CPU host the tier's threads waited 24 s in that core's run queue
(``/proc/PID/task/TID/schedstat``), runnable, until the scheduler's request timed out.

:func:`process_cpus` is the union of the affinity masks of every thread of this process: what
the process as a whole may use. A ``taskset`` or cpuset around the whole engine narrows it; the
pinning of single threads inside it does not. :func:`spread_thread` moves the calling thread
onto those CPUs: every long-lived thread kvcr_policy starts calls it first (a thread pool as its
``initializer``), and the host tier's process applies the CPUs its starter hands it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from . import linux as _os

__all__ = ["cpu_list", "process_cpus", "spread_thread"]


def process_cpus() -> frozenset[int]:
    """The CPUs any thread of this process may run on (empty where the OS cannot say)."""
    if not hasattr(os, "sched_getaffinity"):
        return frozenset()
    try:
        tids = [int(name) for name in os.listdir(_os.proc_root() / "self" / "task")]
    except (OSError, ValueError):
        tids = []
    cpus: set[int] = set()
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile (or another /proc)
            cpus |= os.sched_getaffinity(tid)
    if not cpus:
        cpus = set(os.sched_getaffinity(0))
    return frozenset(cpus)


def spread_thread() -> None:
    """Let the calling thread run on every CPU of :func:`process_cpus` (best effort: where the
    kernel refuses, the thread keeps the CPUs it had)."""
    cpus = process_cpus()
    if cpus:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)


def cpu_list(cpus: Iterable[int]) -> str:
    """``cpus`` as the kernel's list format (``0-3,8``), for a log line."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
