"""CallThreads: the threads that make the store calls, and at what scheduling priority.

Mooncake's batch calls wait for their transfers by polling on the calling thread: the PyPI
wheels are built without ``USE_EVENT_DRIVEN_COMPLETION``, so a call keeps one core busy until
its last transfer completes, while the transfer engine's io thread (and, on the same host, the
segment holder's) moves the bytes. On a 2-core machine the poller took 0.9 to 0.97 of a core
during a ``layer_first`` read, and the threads that move the bytes waited for a core at every
wake-up. ``backend.options.call_priority`` chooses where the calls run:

- ``normal`` (upstream): on the batch's worker thread, at its priority.
- ``idle``: on threads of the ``SCHED_IDLE`` policy. The kernel treats a core that runs only
  such a thread as free: a waking transfer thread takes it at once, and the poller runs only
  on a core nothing else wants. Measured on 2 idle cores: 1.25x the rate of ``normal``. But on
  a host whose every core is busy with other work, the poller runs only in a sliver of time and
  notices a finished call late: with two busy-looping processes on those 2 cores, 0.06x.
- ``auto``: before each call, :func:`choose_idle` decides from the host's load (:func:`load`,
  read from ``/proc/loadavg`` and the cgroup's CPU quota): ``idle`` while at least one of the
  cores this process may use is left over by the tasks running now (the transfer thread and
  the poller take turns on it), else ``normal``. Measured with one busy loop on the 2 cores,
  ``idle`` still read 1.6x ``normal``; with two, ``auto`` kept every call ``normal``.

The limit probe's calls (:mod:`.probe`) run the same way, so the bench's limit is measured
under the same scheduling as the calls it is the limit of.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from kvcr_policy.plugin_api import PluginError

__all__ = [
    "CallThreads",
    "Load",
    "choose_idle",
    "cpu_quota",
    "cpus_available",
    "idle_refused",
    "load",
    "running_tasks",
]

log = logging.getLogger("kvcr_policy_mooncake.priority")

T = TypeVar("T")
Mode = Literal["normal", "idle", "auto"]

#: Cores an idle-priority call needs left over by other tasks: one, where its transfer thread
#: and its poller take turns (the poller yields at once to any other thread).
SPARE_CORES = 1


@dataclass(frozen=True)
class Load:
    """The host's tasks running or ready to run now, and the cores this process may use."""

    running: int
    cpus: int


def running_tasks(loadavg: str) -> int | None:
    """The tasks running or ready to run now, of a ``/proc/loadavg`` text (its fourth field,
    ``running/total``: the count ``/proc/stat`` calls ``procs_running``, in 30 bytes where
    ``/proc/stat`` grows with the host's CPUs and interrupts); None where it has none."""
    fields = loadavg.split()
    running, slash, _ = fields[3].partition("/") if len(fields) > 3 else ("", "", "")
    return int(running) if slash and running.isdigit() else None


def cpu_quota(cpu_max: str) -> float | None:
    """Cores a cgroup v2 ``cpu.max`` text allows (``"200000 100000"`` -> 2.0), None if
    unlimited (``"max ..."``) or unreadable."""
    parts = cpu_max.split()
    if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit() or not int(parts[1]):
        return None
    return int(parts[0]) / int(parts[1])


def _cgroup_cpu_max(root: Path, membership: Path) -> str | None:
    """The ``cpu.max`` of this process's cgroup v2 (``membership``: ``/proc/self/cgroup``),
    None where there is none (cgroup v1, or no CPU controller there)."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    unified = [line[3:] for line in lines if line.startswith("0::")]
    if not unified:
        return None
    try:
        return (root / unified[0].lstrip("/") / "cpu.max").read_text()
    except OSError:
        return None


def cpus_available(
    cgroup_root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")
) -> int:
    """The CPUs this process may run on, fewer where its cgroup's CPU quota allows fewer.
    Read once per :class:`CallThreads`, not per call (measured: 23 us of the 34 a whole
    :func:`load` took on the 2-core machine)."""
    cpus = len(os.sched_getaffinity(0))
    cpu_max = _cgroup_cpu_max(cgroup_root, membership)
    quota = None if cpu_max is None else cpu_quota(cpu_max)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return cpus


def load(loadavg: Path = Path("/proc/loadavg"), cpus: int | None = None) -> Load | None:
    """The host's :class:`Load` now: the running tasks of ``loadavg``, against ``cpus``
    (:func:`cpus_available` unless given). None where ``loadavg`` does not say (then ``auto``
    keeps the upstream priority)."""
    try:
        running = running_tasks(loadavg.read_text())
    except OSError:
        return None
    if running is None:
        return None
    return Load(running, cpus_available() if cpus is None else cpus)


def choose_idle(now: Load | None, in_flight: int) -> bool:
    """Whether the next call runs at idle priority: at least :data:`SPARE_CORES` of the
    process's cores are left over by the tasks running now, not counting the thread asking
    (it is about to make the call) nor this process's ``in_flight`` calls (their pollers).
    Unknown load: no."""
    if now is None:
        return False
    others = max(0, now.running - 1 - in_flight)
    return now.cpus - others >= SPARE_CORES


def _idle_thread() -> None:
    """Thread initializer: the SCHED_IDLE policy for the calling thread (Linux: pid 0).

    A thread started from inside a call would inherit it (Linux resets only real-time policies
    on fork); Mooncake 0.3.13 starts none there (its threads start with the client and its
    connections), which the plugin's tests check after real calls."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def idle_refused(set_idle: Callable[[], None] = _idle_thread) -> str | None:
    """Why a thread of this process cannot take the idle policy (tried on a thread of its
    own, which then ends), or None if it can."""
    why: list[str] = []

    def attempt() -> None:
        try:
            set_idle()
        except (OSError, AttributeError) as err:  # AttributeError: no SCHED_IDLE (not Linux)
            why.append(f"sched_setscheduler(SCHED_IDLE) failed: {err}")

    thread = threading.Thread(target=attempt, name="kvcr-mooncake-idle-check")
    thread.start()
    thread.join()
    return why[0] if why else None


class CallThreads:
    """Runs each store call as ``call_priority`` says; see the module docstring.

    ``measure``, ``decide`` and ``set_idle`` are :func:`load`, :func:`choose_idle` and the
    SCHED_IDLE syscall unless a test injects others. ``origin`` names where the option came
    from, for the error when this host refuses the idle policy."""

    def __init__(
        self,
        mode: Mode,
        threads: int,
        origin: str = "default",
        *,
        measure: Callable[[], Load | None] | None = None,
        decide: Callable[[Load | None, int], bool] | None = None,
        set_idle: Callable[[], None] | None = None,
    ) -> None:
        self.mode = mode
        if measure is None and mode == "auto":  # the CPUs once; the running tasks per call
            measure = partial(load, cpus=cpus_available())
        self.measure = measure or load
        self.decide = decide or choose_idle
        set_idle = set_idle or _idle_thread
        self.counts: Counter[str] = Counter()
        self.last: Load | None = None
        self.refused: str | None = None  # why this host refused the idle policy, if it did
        self.idle_threads: set[int] = set()  # native ids of the idle threads started
        self._lock = threading.Lock()
        self._in_flight = 0
        self._idle: ThreadPoolExecutor | None = None
        if mode == "normal":
            return
        self.refused = idle_refused(set_idle)
        if self.refused is None:
            self._idle = ThreadPoolExecutor(threads, "kvcr-mooncake-idle", self._start, (set_idle,))
        elif mode == "idle":
            message = (
                f"backend.options.call_priority = 'idle' (from {origin}) needs threads of the "
                f"SCHED_IDLE policy, which this host refused ({self.refused}); set it to "
                "'normal', or 'auto' (which then keeps the normal priority)"
            )
            raise PluginError(message, plugin="mooncake")
        else:
            log.warning("call_priority 'auto' keeps the normal priority: %s", self.refused)

    def call(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on the thread the mode chooses; its result or its exception."""
        idle = self._idle
        if idle is None:
            self._count("normal")
            return work(*args)
        with self._lock:
            in_flight = self._in_flight
            self._in_flight += 1
        try:
            if self.mode == "auto":
                self.last = self.measure()
                if not self.decide(self.last, in_flight):
                    self._count("normal")
                    return work(*args)
            self._count("idle")
            return idle.submit(work, *args).result()
        finally:
            with self._lock:
                self._in_flight -= 1

    def _start(self, set_idle: Callable[[], None]) -> None:
        set_idle()
        with self._lock:
            self.idle_threads.add(threading.get_native_id())

    def _count(self, how: str) -> None:
        with self._lock:
            self.counts[how] += 1

    def describe(self) -> dict[str, Any]:
        last = self.last
        return {
            "mode": self.mode,
            "calls_idle": self.counts["idle"],
            "calls_normal": self.counts["normal"],
            "last_load": None if last is None else {"running": last.running, "cpus": last.cpus},
            "refused": self.refused,
        }

    def close(self) -> None:
        """After every call returned."""
        if self._idle is not None:
            self._idle.shutdown(wait=True)
