"""The UCX worker thread: one UCX worker per process, and the one thread that makes every UCX
call.

UCX workers are single-threaded here, so the worker thread (a :class:`~.loop.Loop`) owns the
UCX worker, the control sockets and all protocol state; other threads hand it work with
:meth:`Worker.call` and wait on futures. Each turn runs queued calls and due timers,
progresses the worker, finishes completed :class:`RequestGroup` s, then sleeps in ``select``
on the sockets, the wake-up socket and (``blocking`` mode) the worker's epoll fd, after
arming it (``ucp_worker_arm``: sleep only when UCX has no event pending).

``polling`` never sleeps (lowest latency, one core busy); ``thread`` lets ucxx's own progress
thread drive the worker and checks completions every 0.2 ms.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import numpy as np

from .env import EnvReport, apply_env
from .loop import Loop
from .options import UcxOptions
from .requests import RequestGroup, Timer, memory_view

__all__ = ["RequestGroup", "Timer", "Worker", "acquire_worker", "memory_view"]


log = logging.getLogger("kvcr_policy.backends.peer.worker")


class Worker(Loop):
    """See the module docstring. Build with :func:`acquire_worker`; end with :meth:`release`."""

    name = "kvcr-ucx-worker"

    def __init__(self, options: UcxOptions) -> None:
        super().__init__()
        self.options = options
        self.env: EnvReport = apply_env(options)
        self.progress_mode = self.env.progress_mode[0]
        self.ucx: Any = None  # ucxx._lib.libucxx, imported on this thread
        self._array: Any = None
        self.ucx_worker: Any = None  # the ucxx UCXWorker
        self.address = b""
        self._groups: list[RequestGroup] = []
        self._graveyard: list[tuple[list[Any], list[Any]]] = []
        self._next_tag = 1
        self._users = 0

    def release(self) -> None:
        """Drop one user; the last one stops the thread and frees the worker."""
        global _shared
        with _registry_lock:
            self._users -= 1
            if self._users > 0:
                return
            if _shared is self:
                _shared = None
        self.stop()

    # ---- worker thread only ---------------------------------------------------------------

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
        if not self._graveyard:
            self.later(1.0, self._bury)
        self._graveyard.append((group.requests, group.keep))
        group.failed = np.ones(len(group.requests), dtype=bool)
        group.requests, group.keep = [], []
        group.finish()

    def _bury(self) -> None:
        """Drop abandoned requests UCX has completed after all; look again in a second."""
        self._graveyard = [
            (requests, keep)
            for requests, keep in self._graveyard
            if not all(request.completed for request in requests)
        ]
        if self._graveyard:
            self.later(1.0, self._bury)

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

    # ---- the loop's hooks -----------------------------------------------------------------

    def _setup(self) -> None:
        import ucxx._lib.libucxx as ucx_api
        from ucxx._lib.arr import Array

        self.ucx, self._array = ucx_api, Array
        context = ucx_api.UCXContext(feature_flags=(ucx_api.Feature.TAG, ucx_api.Feature.WAKEUP))
        threaded = self.progress_mode == "thread"
        self.ucx_worker = ucx_api.UCXWorker(context, enable_delayed_submission=threaded)
        if threaded:
            self.ucx_worker.start_progress_thread(polling_mode=False, epoll_timeout=1)
        else:
            self.ucx_worker.init_blocking_progress_mode()
        if self.progress_mode == "blocking":
            self.watch(self.ucx_worker.epoll_file_descriptor, lambda mask: None, False)
        self._context = context
        self.address = self.ucx_worker.address.tobytes()
        log.info("UCX worker up: progress %s, env %s", self.progress_mode, self.env.to_dict())

    def _progress(self, timeout: float) -> float:
        mode = self.progress_mode
        if mode != "thread":
            self.ucx_worker.progress()
        if self._groups:
            self._poll_groups()
        if mode == "polling":
            return 0.0
        if mode == "thread":
            return min(timeout, 0.0002) if self._groups else timeout
        if timeout > 0 and not self.ucx_worker.arm():
            return 0.0  # UCX has events pending: progress again before sleeping
        return timeout

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

    def _teardown(self) -> None:
        if self.ucx_worker is not None and self.progress_mode == "thread":
            self.ucx_worker.stop_progress_thread()
        log.info("UCX worker stopped")


_registry_lock = threading.Lock()
_shared: Worker | None = None


def acquire_worker(options: UcxOptions) -> Worker:
    """The process's UCX worker thread (started on first use), with one more user counted."""
    global _shared
    with _registry_lock:
        worker = _shared
        if worker is None or worker._stopping:
            worker = Worker(options)
            worker.start()
            _shared = worker
        elif options != worker.options:
            log.info(
                "a UCX worker already runs in this process (pid %d); its environment and progress "
                "mode stay in force for later transports",
                os.getpid(),
            )
        worker._users += 1
        return worker
