"""Loop: a small event loop on its own thread: queued calls, timers, and watched sockets.

:class:`~kvcr_policy.backends.peer.worker.Worker` builds on it to own a UCX worker. Any thread may
:meth:`Loop.call` or :meth:`Loop.submit`; everything else runs on the loop's thread. A turn
runs the queued calls, fires due timers (after taking in what arrived meanwhile, so that a
deadline never fires on an answer that is waiting), runs the subclass's :meth:`Loop._progress`
(which says how long the loop may sleep), and sleeps in ``select`` on the watched sockets and a
wake-up socket that :meth:`Loop.call` writes to.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from kvcr_policy.errors import ClosedError, TransportError
from kvcr_policy.memory.cpus import spread_thread

from .requests import Timer

__all__ = ["Loop"]

log = logging.getLogger("kvcr_policy.backends.peer.loop")


class Loop:
    """See the module docstring. Subclasses implement ``_setup``, ``_progress``, ``_teardown``."""

    name = "kvcr-loop"

    def __init__(self) -> None:
        self._ready: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._timers: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = False
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    # ---- any thread -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            message = f"{self.name} could not start: {self._start_error}"
            raise TransportError(message) from self._start_error

    @property
    def on_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop thread, soon."""
        if self._stopping and not self._thread.is_alive():
            raise ClosedError(f"{self.name} is stopped; build a new transport")
        self._ready.append((fn, args))
        if not self.on_loop:
            with contextlib.suppress(OSError):  # a full pipe: the loop is awake anyway
                self._wake_w.send(b"\0")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` on the loop thread; its result or exception lands in a future."""
        future: Future[Any] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args))
            except BaseException as err:
                future.set_exception(err)

        self.call(run)
        return future

    def stop(self) -> None:
        """Stop the loop after its current turn; waits for it unless called on it."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        if not self.on_loop:
            self._thread.join(timeout=10)

    # ---- loop thread only -----------------------------------------------------------------

    def later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(time.monotonic() + delay, fn)
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    def watch(self, sock: Any, callback: Callable[[int], None], write: bool) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
        try:
            self._selector.modify(sock, events, callback)
        except KeyError:
            self._selector.register(sock, events, callback)

    def unwatch(self, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def _setup(self) -> None:
        """Runs first on the loop thread; an exception fails :meth:`start`."""

    def _progress(self, timeout: float) -> float:
        """Runs every turn; returns how long the loop may sleep (at most ``timeout``)."""
        return timeout

    def _teardown(self) -> None:
        """Runs last on the loop thread."""

    def _run(self) -> None:
        # Never confined to the one core an engine pinned the starting thread to (and which
        # that thread may busy-poll): this thread answers every peer of the process.
        spread_thread()
        try:
            self._setup()
            self.watch(self._wake_r, self._drain_wake, False)
        except BaseException as err:
            self._start_error = err
            self._started.set()
            return
        self._started.set()
        try:
            while not self._stopping:
                self._turn()
        except BaseException:
            log.exception("%s failed; peers on this process stop working", self.name)
        finally:
            for fn, args in list(self._ready):
                with contextlib.suppress(Exception):
                    fn(*args)
            self._ready.clear()
            self._teardown()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _turn(self) -> None:
        for _ in range(len(self._ready)):
            fn, args = self._ready.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("loop call %r failed", fn)
        timeout = self._fire_timers()
        # Last before sleeping: a subclass may arm a wake-up that later calls would spoil.
        timeout = self._progress(0.0 if self._ready else timeout)
        if self._ready:
            timeout = 0.0
        for key, mask in self._selector.select(timeout):
            try:
                key.data(mask)
            except Exception:
                log.exception("socket handler failed")

    def _catch_up(self) -> None:
        """Take in what arrived while this thread did not run: UCX completions (a
        :meth:`_progress` that does not sleep) and readable sockets. A timer judges what has
        completed so far; a thread starved on a busy host wakes with a deadline due and the
        answer to it already waiting, and must see the answer first."""
        self._progress(0.0)
        for key, mask in self._selector.select(0):
            try:
                key.data(mask)
            except Exception:
                log.exception("socket handler failed")

    def _fire_timers(self) -> float:
        now = time.monotonic()
        if self._timers and self._timers[0][0] <= now:
            self._catch_up()
            now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                try:
                    timer.fn()
                except Exception:
                    log.exception("timer %r failed", timer.fn)
        if self._timers:
            return max(0.0, min(1.0, self._timers[0][0] - time.monotonic()))
        return 1.0

    def _drain_wake(self, mask: int) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
