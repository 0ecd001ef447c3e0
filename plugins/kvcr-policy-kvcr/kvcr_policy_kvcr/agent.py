"""The NIXL agents: KVCR's own (its progress thread switch) and the probe agent (the limit).

kvcr 0.1.1 builds its NIXL agent inside its progress thread (``kvcr.progress._KVCRProgress.
_initialize_nixl``) with ``nixl_agent_config(num_threads=4, enable_listen_thread=True, ...)``
and NIXL's progress thread left on. That thread spins a whole core even when nothing moves
(measured on 2 cores: ~99 % of one core idle, ~1 % with it off), and it is redundant here:
KVCR's own progress thread polls every transfer it starts (``check_xfer_state``), which is
what advances UCX when NIXL has no thread of its own. Deposits and deliveries stay exact and
as fast without it. kvcr exposes no setting for it, so :func:`starting` wraps the
``nixl_agent`` name kvcr's progress module calls, for the agents this backend names alone:
any other agent in the process is built exactly as before.

The probe agent is a second agent built the same way (UCX, the same worker threads, the same
progress thread setting, no listener) that moves one descriptor between the same two buffers:
what :meth:`~kvcr_policy_kvcr.pool.KvcrPool.probe` times as a restore's limit.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvcr_policy.plugin_api import TransportError

__all__ = ["KVCR_UCX_THREADS", "ProbeAgent", "load_nixl", "starting"]

#: The UCX worker threads kvcr 0.1.1 gives its agent (hard-coded in kvcr/progress.py).
KVCR_UCX_THREADS = 4

_lock = threading.Lock()
_progress_thread: dict[str, bool] = {}  # agent name -> NIXL progress thread, while it starts


def load_nixl(native_logs: bool = False) -> None:
    """Import NIXL with its logging routed like any library's (idempotent).

    NIXL logs errors only (``NIXL_LOG_LEVEL=ERROR``) unless ``native_logs``
    (``observability.native_logs``) or the environment sets its level; decided when NIXL first
    loads in the process.

    Importing NIXL (1.5) configures its ``nixl`` logger to print INFO lines on stdout, where a
    command's JSON (``kvcr-policy bench --format json``) or an engine's own output goes, and
    sets ``logging.raiseExceptions`` for the whole process. Here its records go to the
    application's logging instead (NIXL_LOG_LEVEL, when set, still sets their level), and the
    process's ``raiseExceptions`` stays as it was.
    """
    raise_exceptions = logging.raiseExceptions
    first = "nixl" not in sys.modules
    if first and not native_logs:
        os.environ.setdefault("NIXL_LOG_LEVEL", "ERROR")
    import nixl  # noqa: F401

    if first:
        logging.raiseExceptions = raise_exceptions
    logger = logging.getLogger("nixl")
    for handler in list(logger.handlers):
        if getattr(handler, "stream", None) is sys.stdout:
            logger.removeHandler(handler)
    logger.propagate = True
    if not os.environ.get("NIXL_LOG_LEVEL"):
        logger.setLevel(logging.NOTSET)


def _install() -> None:
    """Wrap ``kvcr.progress.nixl_agent`` once (idempotent)."""
    import kvcr.progress as progress

    original = progress.nixl_agent
    if getattr(original, "__kvcr_policy__", False):
        return

    def nixl_agent(name: str, config: Any = None, *args: Any, **kwargs: Any) -> Any:
        wanted = _progress_thread.get(name)
        if wanted is not None and config is not None:
            config.enable_pthread = wanted  # nixl_agent_config's field for it (nixl 1.5)
        return original(name, config, *args, **kwargs)

    nixl_agent.__kvcr_policy__ = True  # type: ignore[attr-defined]
    nixl_agent.__wrapped__ = original  # type: ignore[attr-defined]
    progress.nixl_agent = nixl_agent


@contextmanager
def starting(name: str, progress_thread: bool) -> Iterator[None]:
    """While a KVCR runner whose agent is ``name`` starts: its NIXL progress thread setting."""
    with _lock:
        _install()
        _progress_thread[name] = progress_thread
    try:
        yield
    finally:
        with _lock:
            _progress_thread.pop(name, None)


class ProbeAgent:
    """One NIXL agent moving one descriptor from ``src`` to ``dst`` (both host memory)."""

    def __init__(
        self, name: str, progress_thread: bool, src: tuple[int, int], dst: tuple[int, int]
    ) -> None:
        from nixl import nixl_agent, nixl_agent_config

        config = nixl_agent_config(
            enable_prog_thread=progress_thread,
            num_threads=KVCR_UCX_THREADS,
            backends=["UCX"],
        )
        self.name = name
        self.agent = nixl_agent(name, config)
        self._registrations = [
            self.agent.register_memory([(address, size, 0, "")], mem_type="DRAM")
            for address, size in (src, dst)
        ]
        self.src, self.dst = src, dst

    def move(self, nbytes: int, timeout: float) -> None:
        """One loopback WRITE of ``nbytes`` from the start of ``src`` to the start of ``dst``."""
        agent = self.agent
        local = agent.get_xfer_descs([(self.src[0], nbytes, 0)], mem_type="DRAM")
        remote = agent.get_xfer_descs([(self.dst[0], nbytes, 0)], mem_type="DRAM")
        handle = agent.initialize_xfer("WRITE", local, remote, self.name)
        try:
            state = agent.transfer(handle)
            deadline = time.monotonic() + timeout
            while state in ("PROC", "PEND"):
                if time.monotonic() > deadline:
                    break
                state = agent.check_xfer_state(handle)
        finally:
            released = agent.release_xfer_handle(handle) is not False
        if state != "DONE" or not released:
            raise TransportError(f"NIXL probe of {nbytes} bytes ended in state {state!r}")

    def close(self) -> None:
        for registration in self._registrations:
            self.agent.deregister_memory(registration)
        self._registrations = []
        self.agent = None
