"""The peer's event loop judges deadlines on what has arrived, never on its own lateness.

A loop thread starved on a busy host wakes with a deadline due and the answer to it already
waiting (a UCX completion to progress, a readable socket). The loop takes those in before any
timer fires, so a late answer counts as life. The starvation is made by a queued call that
holds the loop thread (a real thread, a real socket pair; no UCX needed: ``_progress`` stands
in for a UCX worker with a completion waiting).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

from kvcr_policy.backends.peer.loop import Loop
from tests.support.cpus import needs_two_cpus, on_pinned_thread


class Stub(Loop):
    """A loop whose ``_progress`` completes what :meth:`arrive` left waiting."""

    name = "kvcr-loop-test"

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()
        self.completed = 0

    def arrive(self) -> None:
        self.waiting.set()

    def _progress(self, timeout: float) -> float:
        if self.waiting.is_set():
            self.waiting.clear()
            self.completed += 1
        return timeout


class Starved:
    """One queued call that arms a deadline ``after`` seconds ahead, then holds the loop thread
    (as a descheduled thread is held) until the deadline is overdue and :meth:`release`."""

    def __init__(self, loop: Loop, after: float, deadline: Callable[[], None]) -> None:
        self.holding = threading.Event()
        self._released = threading.Event()

        def hold() -> None:
            loop.later(after, deadline)
            self.holding.set()
            time.sleep(after * 4)
            self._released.wait(10)

        loop.call(hold)
        assert self.holding.wait(10), "the loop never ran the holding call"

    def release(self) -> None:
        self._released.set()


def test_a_due_timer_sees_a_completion_that_arrived_while_the_loop_was_starved() -> None:
    loop = Stub()
    loop.start()
    try:
        seen: list[int] = []
        done = threading.Event()

        def deadline() -> None:
            seen.append(loop.completed)
            done.set()

        starved = Starved(loop, 0.05, deadline)
        loop.arrive()  # the answer arrives while the thread is held
        starved.release()
        assert done.wait(10)
        assert seen == [1], "the deadline fired before the waiting completion was taken in"
    finally:
        loop.stop()


def test_a_due_timer_sees_a_frame_that_arrived_while_the_loop_was_starved() -> None:
    loop = Stub()
    loop.start()
    a, b = socket.socketpair()
    a.setblocking(False)
    try:
        frames: list[bytes] = []
        seen: list[int] = []
        done = threading.Event()

        def readable(mask: int) -> None:
            frames.append(a.recv(64))

        def deadline() -> None:
            seen.append(len(frames))
            done.set()

        loop.submit(loop.watch, a, readable, False).result(10)
        starved = Starved(loop, 0.05, deadline)
        b.send(b"pong")
        starved.release()
        assert done.wait(10)
        assert seen == [1], "the deadline fired before the waiting frame was read"
    finally:
        loop.stop()
        a.close()
        b.close()


@needs_two_cpus
def test_a_loop_started_from_a_pinned_thread_runs_on_every_cpu_of_the_process() -> None:
    """An engine pins its compute thread to one CPU (vLLM's CPU worker pins the thread that
    builds its connector, then busy-polls it between steps): a loop started from that thread,
    which answers every peer of the process, still runs on every CPU the process may use."""
    everything = os.sched_getaffinity(0)
    loop = Stub()
    on_pinned_thread(min(everything), loop.start)
    try:
        assert loop.submit(os.sched_getaffinity, 0).result(10) == everything
    finally:
        loop.stop()
