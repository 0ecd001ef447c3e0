"""The UCX thread: the process's UCX context, the links (one UCX worker per connection), and
the one thread that makes every UCX call.

UCX workers are single-threaded here, so the worker thread (a :class:`~.loop.Loop`) owns the
UCX context, every :class:`~.link.Link`, the control sockets and all protocol state; other
threads hand it work with :meth:`Worker.call` and wait on futures. Each turn runs queued calls
and due timers, progresses every link (which finishes completed request groups), then sleeps in
``select`` on the sockets, the wake-up socket and (``blocking`` mode) each link's epoll fd,
after arming them (``ucp_worker_arm``: sleep only when UCX has no event pending).

Nothing long runs on this thread: heartbeats are answered and UCX progressed whatever the rest
of the process does, as long as that releases the GIL (pre-faulting a tier, the longest thing
a server does, runs on a helper thread through :func:`~kvcr_policy.memory.linux.madvise`, which
does).

``polling`` never sleeps (lowest latency, one core busy); ``thread`` lets ucxx's own progress
thread drive each link's worker and checks completions every 0.2 ms.

A worker built with ``ucx=False`` is the same loop without UCX (ucxx is never imported): what a
Unix-socket server and its shared-memory clients need, where pages never travel in messages.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from kvcr_policy.errors import UnsupportedError

from .env import EnvReport, apply_env, same_host_tls
from .link import Link, frozen_links
from .loop import Loop
from .options import UcxOptions
from .requests import RequestGroup, Timer, memory_view

__all__ = ["Link", "RequestGroup", "Timer", "Worker", "acquire_worker", "memory_view"]


log = logging.getLogger("kvcr_policy.backends.peer.worker")


class Worker(Loop):
    """See the module docstring. Build with :func:`acquire_worker`; end with :meth:`release`."""

    name = "kvcr-ucx-worker"

    def __init__(self, options: UcxOptions, ucx: bool = True) -> None:
        super().__init__()
        self.options = options
        self.uses_ucx = ucx
        # Without UCX no UCX_* variable of this process is touched.
        self.env: EnvReport = apply_env(options) if ucx else EnvReport({}, {}, ("none", "no UCX"))
        self.progress_mode = self.env.progress_mode[0]
        self.ucx: Any = None  # ucxx._lib.libucxx, imported on this thread
        self._array: Any = None
        self._context: Any = None
        self._same_host_context: Any = None  # made on first use (see open_link)
        self.links: set[Link] = set()
        self.links_opened = 0
        self._users = 0

    def release(self) -> None:
        """Drop one user; the last one stops the thread and frees the worker."""
        with _registry_lock:
            self._users -= 1
            if self._users > 0:
                return
            if _shared.get(self.uses_ucx) is self:
                del _shared[self.uses_ucx]
        self.stop()

    def describe(self) -> dict[str, Any]:
        """Links open now, opened in all, and frozen (see :mod:`.link`); any thread."""
        return {
            "links_open": len(self.links),
            "links_opened": self.links_opened,
            "links_frozen": frozen_links(),
        }

    # ---- worker thread only ---------------------------------------------------------------

    def open_link(self, name: str, same_host: bool = False) -> Link:
        """A new UCX worker for one connection or session (see :mod:`.link`).

        ``same_host``: a session over shared memory, whose worker offers shared-memory
        transports only (:func:`~.env.same_host_tls` says why: a peer that dies while its
        endpoint is being wired up must never abort this process).
        """
        if self.ucx is None:
            raise UnsupportedError(f"{name}: this process's worker runs without UCX")
        context = self._context
        if same_host:
            context = self._same_host()
        link = Link(self, self.ucx, self._array, context, name)
        self.links.add(link)
        self.links_opened += 1
        if link.epoll_fd is not None:
            self.watch(link.epoll_fd, lambda mask: None, False)
        return link

    def _same_host(self) -> Any:
        if self._same_host_context is None:
            tls = same_host_tls(os.environ.get("UCX_TLS"))
            if tls is None:
                self._same_host_context = self._context
            else:
                feature = self.ucx.Feature
                self._same_host_context = self.ucx.UCXContext(
                    {"TLS": tls}, feature_flags=(feature.TAG, feature.WAKEUP)
                )
            log.info("same-host sessions: UCX_TLS %s", tls or "as the process's")
        return self._same_host_context

    def drop_link(self, link: Link) -> None:
        """Stop progressing ``link`` (it was destroyed or frozen)."""
        self.links.discard(link)
        if link.epoll_fd is not None:
            self.unwatch(link.epoll_fd)

    # ---- the loop's hooks -----------------------------------------------------------------

    def _setup(self) -> None:
        if not self.uses_ucx:
            return
        import ucxx._lib.libucxx as ucx_api
        from ucxx._lib.arr import Array

        self.ucx, self._array = ucx_api, Array
        feature = ucx_api.Feature
        self._context = ucx_api.UCXContext(feature_flags=(feature.TAG, feature.WAKEUP))
        log.info("UCX up: progress %s, env %s", self.progress_mode, self.env.to_dict())

    def _progress(self, timeout: float) -> float:
        mode = self.progress_mode
        busy = False
        for link in list(self.links):
            link.progress()
            busy = busy or bool(link.groups)
        if mode == "polling":
            return 0.0
        if mode == "thread":
            return min(timeout, 0.0002) if busy else timeout
        if timeout > 0:
            for link in self.links:
                if not link.arm():
                    return 0.0  # UCX has events pending: progress again before sleeping
        return timeout

    def _teardown(self) -> None:
        for link in list(self.links):
            link.stop()
        self.links.clear()
        if self.uses_ucx:
            log.info("UCX worker stopped")


_registry_lock = threading.Lock()
_shared: dict[bool, Worker] = {}  # by uses_ucx


def _forget_in_child() -> None:
    """A forked child has no worker thread (only the forking thread survives a fork): it must
    start its own, never hand work to a loop that does not run there (its calls would wait
    for answers until their deadlines). Engines fork their workers (vLLM's mp executor)."""
    global _registry_lock
    _registry_lock = threading.Lock()  # the parent may have held it at the fork
    _shared.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def acquire_worker(options: UcxOptions, ucx: bool = True) -> Worker:
    """The process's UCX worker thread (started on first use), with one more user counted;
    ``ucx=False``: the process's worker loop without UCX (see the module docstring)."""
    with _registry_lock:
        worker = _shared.get(ucx)
        if worker is None or worker._stopping:
            worker = Worker(options, ucx)
            worker.start()
            _shared[ucx] = worker
        elif options != worker.options:
            log.info(
                "a UCX worker already runs in this process (pid %d); its environment and progress "
                "mode stay in force for later transports",
                os.getpid(),
            )
        worker._users += 1
        return worker
