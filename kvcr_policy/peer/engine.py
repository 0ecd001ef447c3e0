"""The engine: one UCX worker per process, and the one thread that makes every UCX call.

UCX workers are single-threaded here, so the engine thread owns the worker, the control
sockets and all protocol state; other threads hand it work with :meth:`Engine.call` (a deque
and a wake-up pipe) and wait on futures. Each turn of the loop runs queued calls, progresses
the worker, finishes completed :class:`RequestGroup`\\ s, fires timers, then sleeps in
``select`` on the sockets, the wake-up pipe and (``blocking`` mode) the worker's epoll fd,
after arming it (``ucp_worker_arm``: sleep only when UCX has no event pending).

``polling`` never sleeps (lowest latency, one core busy); ``thread`` lets ucxx's own progress
thread drive the worker and checks completions every 0.2 ms.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import itertools
import logging
import os
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from ..errors import ClosedError, TransportError
from .env import EnvReport, apply_env
from .options import UcxOptions

__all__ = ["Engine", "RequestGroup", "Timer", "acquire_engine", "memory_view"]

log = logging.getLogger("kvcr_policy.peer.engine")


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


class Engine:
    """See the module docstring. Build with :func:`acquire_engine`; end with :meth:`release`."""

    def __init__(self, options: UcxOptions) -> None:
        self.options = options
        self.env: EnvReport = apply_env(options)
        self.progress_mode = self.env.progress_mode[0]
        self.ucx: Any = None  # ucxx._lib.libucxx, imported on the engine thread
        self._array: Any = None
        self.worker: Any = None
        self.address = b""
        self._ready: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._timers: list[tuple[float, int, Timer]] = []
        self._order = itertools.count()
        self._groups: list[RequestGroup] = []
        self._graveyard: list[tuple[list[Any], list[Any]]] = []
        self._next_tag = 1
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = False
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kvcr-ucx-engine", daemon=True)
        self._users = 0

    # ---- any thread -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            message = f"UCX could not start: {self._start_error}"
            raise TransportError(message) from self._start_error

    @property
    def on_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the engine thread, soon."""
        if self._stopping and not self._thread.is_alive():
            raise ClosedError("the UCX engine is stopped; build a new transport")
        self._ready.append((fn, args))
        if not self.on_loop:
            with contextlib.suppress(OSError):  # a full pipe: the loop is awake anyway
                self._wake_w.send(b"\0")

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` on the engine thread; its result or exception lands in a future."""
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

    # ---- engine thread only ---------------------------------------------------------------

    def later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = Timer(time.monotonic() + delay, fn)
        heapq.heappush(self._timers, (timer.when, next(self._order), timer))
        return timer

    def watch(self, sock: socket.socket, callback: Callable[[int], None], write: bool) -> None:
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if write else 0)
        try:
            self._selector.modify(sock, events, callback)
        except KeyError:
            self._selector.register(sock, events, callback)

    def unwatch(self, sock: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def track(self, group: RequestGroup) -> None:
        self._groups.append(group)

    def abandon(self, group: RequestGroup) -> None:
        """Finish a send group now, every message failed, keeping its requests and buffers.

        Sends to a peer that died while connected without error handling (shared memory)
        never complete, not even after the endpoint is closed (measured, UCX 1.21); their
        buffers are only ever read, so the transfer's owner may settle now. The requests stay
        referenced here, with the buffers they read from, until UCX completes them (if ever).
        """
        if group.done or not group.sending:
            return
        self._graveyard.append((group.requests, group.keep))
        group.failed = np.ones(len(group.requests), dtype=bool)
        group.requests, group.keep = [], []
        group.finish()

    @staticmethod
    def close_endpoint(ep: Any, error_handling: bool) -> None:
        """Close ``ep`` and cancel the receives posted on it (they complete as cancelled).

        Measured with ucxx 0.52 / UCX 1.21: with error handling, ``close()`` of an endpoint
        whose peer failed crashes the process and ``close()`` of a live one leaves receives
        pending, while ``close_blocking()`` does neither; without error handling,
        ``close_blocking()`` hangs when the peer died mid-rendezvous, while ``close()``
        returns at once and the next progress cancels the receives.
        """
        try:
            if error_handling:
                ep.close_blocking()
            else:
                ep.close()
        except Exception as err:  # the endpoint is gone either way
            log.debug("closing an endpoint: %s", err)

    def tags(self, count: int) -> int:
        """The first of ``count`` fresh tags, unique in this process's worker."""
        base = self._next_tag
        self._next_tag = base + max(1, count)
        return base

    def post(self, group: RequestGroup, ep: Any, send: bool, view: np.ndarray, tag: int) -> None:
        """Post one tag send or receive of ``view`` (kept alive by the group)."""
        array = self._array(view)
        tag_obj = self.ucx.UCXXTag(tag)
        request = ep.tag_send(array, tag_obj) if send else ep.tag_recv(array, tag_obj)
        group.requests.append(request)
        group.keep.append(array)

    def release(self) -> None:
        """Drop one user; the last one stops the thread and frees the worker."""
        with _registry_lock:
            self._users -= 1
            if self._users > 0:
                return
            global _shared
            if _shared is self:
                _shared = None
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        if not self.on_loop:
            self._thread.join(timeout=10)

    # ---- the loop -------------------------------------------------------------------------

    def _open_worker(self) -> None:
        import ucxx._lib.libucxx as ucx_api
        from ucxx._lib.arr import Array

        self.ucx, self._array = ucx_api, Array
        context = ucx_api.UCXContext(feature_flags=(ucx_api.Feature.TAG, ucx_api.Feature.WAKEUP))
        threaded = self.progress_mode == "thread"
        self.worker = ucx_api.UCXWorker(context, enable_delayed_submission=threaded)
        if threaded:
            self.worker.start_progress_thread(polling_mode=False, epoll_timeout=1)
        else:
            self.worker.init_blocking_progress_mode()
        self._context = context
        self.address = self.worker.address.tobytes()

    def _run(self) -> None:
        try:
            self._open_worker()
            self._selector.register(self._wake_r, selectors.EVENT_READ, self._drain_wake)
            if self.progress_mode == "blocking":
                epoll = self.worker.epoll_file_descriptor
                self._selector.register(epoll, selectors.EVENT_READ, lambda mask: None)
        except BaseException as err:
            self._start_error = err
            self._started.set()
            return
        self._started.set()
        log.info("UCX engine up: progress %s, env %s", self.progress_mode, self.env.to_dict())
        try:
            while not self._stopping:
                self._turn()
        except BaseException:
            log.exception("UCX engine loop failed; peers on this process stop working")
        finally:
            self._shutdown()

    def _turn(self) -> None:
        for _ in range(len(self._ready)):
            fn, args = self._ready.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("engine call %r failed", fn)
        mode = self.progress_mode
        if mode != "thread":
            self.worker.progress()
        if self._groups:
            self._poll_groups()
        timeout = self._fire_timers()
        if self._ready or mode == "polling":
            timeout = 0.0
        elif mode == "thread":
            timeout = min(timeout, 0.0002) if self._groups else timeout
        elif not self.worker.arm():
            timeout = 0.0  # UCX has events pending: progress again before sleeping
        for key, mask in self._selector.select(timeout):
            try:
                key.data(mask)
            except Exception:
                log.exception("socket handler failed")

    def _poll_groups(self) -> None:
        still: list[RequestGroup] = []
        finished: list[RequestGroup] = []
        for group in self._groups:
            (finished if group.poll() else still).append(group)
        self._groups = still
        for group in finished:
            try:
                group.finish()
            except Exception:
                log.exception("completion handler failed")

    def _fire_timers(self) -> float:
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
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _shutdown(self) -> None:
        for fn, args in list(self._ready):
            try:
                fn(*args)
            except Exception:
                log.exception("engine call %r failed during shutdown", fn)
        self._ready.clear()
        if self.worker is not None and self.progress_mode == "thread":
            self.worker.stop_progress_thread()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        log.info("UCX engine stopped")


_registry_lock = threading.Lock()
_shared: Engine | None = None


def acquire_engine(options: UcxOptions) -> Engine:
    """The process's engine (started on first use), with one more user counted."""
    global _shared
    with _registry_lock:
        engine = _shared
        if engine is None or engine._stopping:
            engine = Engine(options)
            engine.start()
            _shared = engine
        elif options != engine.options:
            log.info(
                "a UCX engine already runs in this process (pid %d); its environment and progress "
                "mode stay in force for later transports",
                os.getpid(),
            )
        engine._users += 1
        return engine
