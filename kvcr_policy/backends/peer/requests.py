"""UCX request bookkeeping: request groups, timers, and views of raw memory.

Nothing here calls UCX beyond reading a request's ``completed`` flag and status, so it is
cheap to import and to test without a worker.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["RequestGroup", "Stall", "Timer", "memory_view", "message_limit"]


def memory_view(address: int, nbytes: int) -> np.ndarray:
    """A writable uint8 view of ``nbytes`` at ``address`` (the caller keeps the memory alive)."""
    if nbytes <= 0:
        return np.zeros(0, dtype=np.uint8)
    raw = (ctypes.c_uint8 * nbytes).from_address(address)
    return np.ctypeslib.as_array(raw)


class Timer:
    __slots__ = ("cancelled", "fn", "when")

    def __init__(self, when: float, fn: Callable[[], None]) -> None:
        self.when, self.fn, self.cancelled = when, fn, False

    def cancel(self) -> None:
        self.cancelled = True


class RequestGroup:
    """The UCX requests of one transfer; ``on_done(failed)`` runs once all have completed.

    Requests mostly complete in the order they were posted, so :meth:`poll` only looks at the
    first unfinished one: a group of 30,000 messages costs O(1) per loop turn, O(n) in total.
    ``failed`` is a bool mask over the requests; ``keep`` holds the buffers UCX writes or
    reads until then.
    """

    __slots__ = ("_next", "done", "failed", "keep", "on_done", "requests", "sending")

    def __init__(self, on_done: Callable[[np.ndarray], None], *, sending: bool = False) -> None:
        self.sending = sending
        self.requests: list[Any] = []
        self.keep: list[Any] = []
        self.on_done = on_done
        self.failed: np.ndarray | None = None
        self.done = False
        self._next = 0

    def poll(self) -> bool:
        if self.done:
            return True
        requests = self.requests
        n = len(requests)
        while self._next < n:
            request = requests[self._next]
            if not request.completed:
                return False
            try:
                request.check_error()
            except Exception:  # any UCX status but OK fails this message only
                if self.failed is None:
                    self.failed = np.zeros(n, dtype=bool)
                self.failed[self._next] = True
            self._next += 1
        return True

    @property
    def progress(self) -> int:
        """A count that grows as its messages complete (in order), and once more when the group
        finishes: what a :class:`Stall` watches."""
        return self._next + self.done

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        failed = self.failed if self.failed is not None else np.zeros(len(self.requests), bool)
        self.requests, self.keep = [], []
        self.on_done(failed)


class Stall:
    """A deadline on progress, not on time: ``on_stall()`` runs once ``measure()`` (a count of
    what completed so far) has not moved for ``limit`` seconds. A transfer that keeps moving
    messages is never cut, however long it takes on a busy host; one that stops is cut
    ``limit`` seconds after its last sign of life. ``later(delay, fn)`` schedules on the loop.
    """

    __slots__ = ("_last", "_later", "_timer", "limit", "measure", "on_stall")

    def __init__(
        self,
        later: Callable[[float, Callable[[], None]], Timer],
        limit: float,
        measure: Callable[[], int],
        on_stall: Callable[[], None],
    ) -> None:
        self._later, self.limit, self.measure, self.on_stall = later, limit, measure, on_stall
        self._last = measure()
        self._timer = later(limit, self._check)

    def _check(self) -> None:
        now = self.measure()
        if now != self._last:
            self._last = now
            self._timer = self._later(self.limit, self._check)
        else:
            self.on_stall()

    def cancel(self) -> None:
        self._timer.cancel()


def message_limit(op_timeout_s: float, nbytes: int) -> float:
    """How long one message of ``nbytes`` may take: ``op_timeout_s`` per GiB, at least
    ``op_timeout_s``. A :class:`Stall` sees no progress inside one message, so the one transfer
    made of a single large message (the benchmark's probe) is bounded by its size instead."""
    return op_timeout_s * max(1.0, nbytes / (1 << 30))
