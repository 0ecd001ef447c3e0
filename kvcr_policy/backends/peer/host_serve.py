"""The host tier's own process: a peer server on a Unix socket only, exiting once idle.

Started by :class:`~.host_tier.HostTier` (``python -m kvcr_policy.backends.peer.host_serve``),
which writes one JSON object on its stdin (never on a command line, which every user of the
host can read): ``socket`` (the path to listen on), ``overrides`` (the starter's
configuration), ``secret`` (its clients' secret when that is in no file), ``idle_exit_s``,
``parent`` (the starter's pid, for the log), ``lock_fd`` and ``cpus`` (the CPUs of the
starter's process: the tier runs on those, not on the one CPU an engine may have pinned the
starting thread to; see :mod:`kvcr_policy.memory.cpus`). It holds the starter's ``flock`` as
that inherited descriptor for its whole life (and writes its pid in the lock file), and logs
to stderr (the tier's log file). Once its configuration is read it forks and the parent exits
(status 0: a configuration error exits 2 before that), so the starter reaps it at once.
SIGTERM or SIGINT stop it cleanly, as ``kvcr-policy serve``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

__all__ = ["main"]

#: The largest spec read from stdin (a configuration is a few KiB).
MAX_SPEC_BYTES = 1 << 20

log = logging.getLogger("kvcr_policy.backends.peer.host_tier")


def main() -> int:
    from kvcr_policy.config.loading import load_config
    from kvcr_policy.errors import KVCRPolicyError
    from kvcr_policy.memory import preflight

    from .server.server import PeerServer

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        spec: dict[str, Any] = json.loads(sys.stdin.read(MAX_SPEC_BYTES))
        cpus = _run_on(spec.get("cpus"))  # first: every thread started from now inherits it
        secret = spec.get("secret")
        environ = {} if secret is None else {"KVCR_POLICY_SECURITY__SECRET": str(secret)}
        loaded = load_config(overrides=spec["overrides"], environ=environ)
        preflight.check_placement(
            loaded.config.placement,
            loaded.origin(preflight.SETTING),
            what="each tier of the host tier",
        )
        server = PeerServer(loaded, listen=f"unix:{spec['socket']}")
        idle_exit = float(spec.get("idle_exit_s") or 0)
    except (KVCRPolicyError, ValueError, KeyError, TypeError) as err:
        log.error("host tier: cannot start: %s", err)
        return 2
    # Leave the starter: it reaps this short-lived parent, and the tier, adopted by init (or the
    # nearest subreaper), never lingers as a zombie of a rank that started it.
    if os.fork() > 0:
        os._exit(0)
    _note_pid(spec.get("lock_fd"))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        server.start()
    except KVCRPolicyError as err:
        log.error("host tier: cannot start: %s", err)
        return 2
    log.info(
        "host tier on %s for pid %s and every process of this user: exits %s (CPUs %s)",
        server.address,
        spec.get("parent"),
        f"{idle_exit:g} s after its last client left" if idle_exit else "only when stopped",
        cpus,
    )
    last_busy = time.monotonic()
    try:
        while not stop.wait(0.5):
            busy = server.worker.submit(lambda: len(server.sessions)).result()
            if busy:
                last_busy = time.monotonic()
            elif idle_exit and time.monotonic() - last_busy > idle_exit:
                log.info("no client for %g s: exiting", idle_exit)
                break
    finally:
        server.stop()
    return 0


def _run_on(cpus: Any) -> str:
    """Run this process (its one thread so far; the server's threads inherit it) on ``cpus``
    (the spec's list of CPU numbers; None: where it started); the CPUs it runs on, as text."""
    from kvcr_policy.memory.cpus import cpu_list

    if cpus is not None:
        if not isinstance(cpus, list) or not all(
            isinstance(cpu, int) and not isinstance(cpu, bool) and cpu >= 0 for cpu in cpus
        ):
            raise ValueError(f"spec 'cpus': expected a list of CPU numbers, got {cpus!r}")
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as err:  # none of them is this process's any more (a cpuset changed)
            log.warning("host tier: cannot run on CPUs %s (%s); keeps its own", cpus, err)
    return cpu_list(os.sched_getaffinity(0))


def _note_pid(lock_fd: Any) -> None:
    """Write this process's pid into the lock file it holds (``NAME.lock`` names the tier's
    process, for an operator's ``kill``)."""
    if isinstance(lock_fd, int) and lock_fd >= 0:
        with contextlib.suppress(OSError):
            os.ftruncate(lock_fd, 0)
            os.pwrite(lock_fd, f"{os.getpid()}\n".encode(), 0)


if __name__ == "__main__":
    sys.exit(main())
