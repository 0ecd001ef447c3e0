"""What ``bench`` says while it runs, on stderr: a bar on a terminal, lines everywhere else.

Off a terminal (CI, a log file, ``nohup``) a bar draws nothing, and a run of minutes would be
silent. :class:`Lines` prints one line per step (``bench [3/12 14 s] P: storing 512 pages``)
and, while one step takes long, a line every ``every`` seconds saying it is still on it, so
that a reader never waits more than ``every`` seconds (5 by default) for a sign of life.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO

__all__ = ["EVERY_S", "Lines", "progress"]

#: Longest silence off a terminal, in seconds.
EVERY_S = 5.0


class Lines:
    """A step counter that prints lines; a context manager whose thread keeps time."""

    def __init__(
        self,
        total: int,
        stream: TextIO | None = None,
        every: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.every, self.clock = total, every, clock
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.current = "starting"
        self.start = self.last = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="bench-progress", daemon=True)

    def __call__(self, message: str) -> None:
        with self._lock:
            self.done += 1
            self.current = message
            self._write(message)

    def _write(self, text: str) -> None:
        now = self.clock()
        count = f"{min(self.done, self.total)}/{self.total}"
        self.stream.write(f"bench [{count} {now - self.start:.0f} s] {text}\n")
        self.stream.flush()
        self.last = now

    def _beat(self) -> None:
        while True:
            with self._lock:
                due = self.last + self.every - self.clock()
                if due <= 0:
                    self._write(f"still on: {self.current}")
                    due = self.every
            if self._stop.wait(due):
                return

    def __enter__(self) -> Lines:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()


def progress(total: int, console: Any) -> tuple[Any, Callable[[str], None]]:
    """(context manager, step callback): a rich bar on a terminal, else :class:`Lines`."""
    if not console.file.isatty():
        lines = Lines(total, stream=console.file)
        return lines, lines
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    bar = Bar(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    task = bar.add_task("bench", total=total)

    def say(message: str) -> None:
        bar.update(task, advance=1, description=message)

    return bar, say
