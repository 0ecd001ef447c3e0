"""UCX request bookkeeping: request groups, timers, and views of raw memory.

Nothing here calls UCX beyond reading a request's ``completed`` flag and status, so it is
cheap to import and to test without a worker.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["RequestGroup", "Timer", "memory_view"]


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

    def finish(self) -> None:
        if self.done:
            return
        self.done = True
        failed = self.failed if self.failed is not None else np.zeros(len(self.requests), bool)
        self.requests, self.keep = [], []
        self.on_done(failed)
