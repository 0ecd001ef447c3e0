"""Warnings that repeat, rate-limited: the first of a kind is logged at once, then at most one
line per interval with the count of those left out since.

A peer that is down fails every call: without this, each call logged its own warning (35
lines in 17 s from one client; more inside an engine's prefetch and backup threads). A kind is
what the caller names it (a message template and whatever tells two sources apart: the peer,
the pool); at most :data:`MAX_KINDS` kinds are remembered (the oldest forgotten first), so
the memory it takes stays bounded whatever the messages are. The standard library's logging
has no rate limit and a filter cannot add the count to the line it lets through, hence this.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["INTERVAL_S", "MAX_KINDS", "Repeats"]

#: Seconds between two lines of one kind.
INTERVAL_S = 10.0
#: Kinds remembered at once.
MAX_KINDS = 256


class Repeats:
    """Rate-limited warnings of ``log`` (module docstring); ``clock`` for tests."""

    def __init__(
        self,
        log: logging.Logger,
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.interval_s = interval_s
        self._clock = clock
        self._kinds: OrderedDict[str, list[float]] = OrderedDict()  # kind -> [last, left out]
        self._lock = threading.Lock()

    def warning(self, kind: str, message: str, *args: object) -> None:
        """Log ``message % args`` as a warning unless a line of ``kind`` went out less than
        ``interval_s`` ago (then count it); the next line says how many were left out."""
        now = self._clock()
        with self._lock:
            entry = self._kinds.get(kind)
            if entry is not None and now - entry[0] < self.interval_s:
                entry[1] += 1
                return
            left_out, since = (int(entry[1]), now - entry[0]) if entry is not None else (0, 0.0)
            self._kinds[kind] = [now, 0]
            self._kinds.move_to_end(kind)
            while len(self._kinds) > MAX_KINDS:
                self._kinds.popitem(last=False)
        if left_out:
            message += f" ({left_out} more like this in the last {since:.0f} s)"
        self.log.warning(message, *args)
