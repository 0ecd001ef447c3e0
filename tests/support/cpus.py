"""Threads pinned to one CPU, as an engine pins its compute threads (real ``sched_setaffinity``)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

__all__ = ["needs_two_cpus", "on_pinned_thread"]

T = TypeVar("T")

#: Pinning one thread changes nothing a test can see on a process that has one CPU only.
needs_two_cpus = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2,
    reason="this process may run on one CPU only: a thread pinned to it is not narrowed",
)


def on_pinned_thread(cpu: int, fn: Callable[[], T], timeout: float = 300.0) -> T:
    """``fn()`` run on a new thread pinned to ``cpu`` alone (what it raises is raised here)."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        os.sched_setaffinity(0, {cpu})
        try:
            result.append(fn())
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=run, name=f"pinned-to-cpu-{cpu}")
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the pinned thread did not finish within {timeout} s"
    if errors:
        raise errors[0]
    return result[0]  # type: ignore[no-any-return]
