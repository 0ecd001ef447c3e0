"""A busy host on demand: a CPU hog of busy processes, bounded in time, stopped by its PIDs.

An inference host is a busy host (tokenisers, schedulers and other ranks share its cores), so
the peer's data-path, fault and reconnect tests also run under this hog, and the whole suite
must pass with it running. Each busy process spins in pure Python until its own deadline, so
a hog whose owner dies still ends on time; :meth:`CpuHog.stop` kills exactly the PIDs it
started (never by name: another hog, or a user's program, is left alone).

By hand, from the repository root::

    python -m tests.support.load --seconds 600                  # hog until Ctrl-C or 600 s
    python -m tests.support.load --seconds 5400 -- bash .ci/run  # a command under the hog

The second form runs the command with the hog (two busy processes per core by default),
stops the hog when the command ends, and exits with the command's status.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from types import TracebackType

__all__ = ["TEST_HOG_S", "CpuHog", "cores", "main"]

#: Busy processes per core: twice as many as cores keeps every core's run queue non-empty
#: while the process under test runs, so it gets about a third of a core.
PER_CORE = 2
#: The lifetime of a hog a test starts: longer than any test, which stops it by its PIDs when it
#: ends (the deadline only matters if the test process itself dies).
TEST_HOG_S = 1800.0
#: A busy process checks its deadline once per this many loop turns (a few ms of spinning).
_SPIN = 200_000
_BUSY = (
    "import time\n"
    "end = time.monotonic() + {seconds!r}\n"
    "while time.monotonic() < end:\n"
    "    for _ in range({spin}):\n"
    "        pass\n"
)


def cores() -> int:
    """The cores this process may run on (its affinity mask, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class CpuHog:
    """``per_core`` busy processes per core (``processes`` overrides the count), each ending by
    itself after ``seconds``; a context manager that starts and stops them."""

    def __init__(
        self, *, seconds: float, per_core: int = PER_CORE, processes: int | None = None
    ) -> None:
        if not 0 < seconds <= 7 * 86400:
            raise ValueError(f"seconds must be in (0, 604800], got {seconds!r}")
        count = processes if processes is not None else per_core * cores()
        if not 1 <= count <= 4096:
            raise ValueError(f"a hog of {count} processes is not sensible (1..4096)")
        self.seconds = float(seconds)
        self.count = count
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def start(self) -> CpuHog:
        if self._procs:
            raise RuntimeError("this hog is already running; stop it first")
        code = _BUSY.format(seconds=self.seconds, spin=_SPIN)
        try:
            for _ in range(self.count):
                self._procs.append(
                    subprocess.Popen(
                        [sys.executable, "-S", "-c", code],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        except BaseException:
            self.stop()
            raise
        return self

    def running(self) -> int:
        """How many of the busy processes still run."""
        return sum(1 for proc in self._procs if proc.poll() is None)

    def stop(self) -> None:
        """Kill every busy process this hog started (by PID) and reap them; idempotent."""
        procs, self._procs = self._procs, []
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):  # ended on its own just now
                    proc.send_signal(signal.SIGKILL)
        for proc in procs:
            proc.wait()

    def __enter__(self) -> CpuHog:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.load",
        description="Run a CPU hog (busy processes, bounded in time), alone or around a command.",
    )
    parser.add_argument("--seconds", type=float, default=600.0, help="hog lifetime (default 600)")
    parser.add_argument(
        "--per-core", type=int, default=PER_CORE, help=f"busy processes per core ({PER_CORE})"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND to run under it")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        hog = CpuHog(seconds=args.seconds, per_core=args.per_core)
    except ValueError as err:
        parser.error(str(err))
    with hog:
        pids = " ".join(map(str, hog.pids))
        print(f"cpu hog: {hog.count} busy processes on {cores()} cores for at most "
              f"{args.seconds:g} s (pids {pids})", file=sys.stderr, flush=True)  # fmt: skip
        if command:
            return subprocess.call(command)
        deadline = time.monotonic() + args.seconds
        try:
            while hog.running() and time.monotonic() < deadline:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
