"""A peer tier served from this process until told to stop: what ``kvcr-policy serve`` runs
(:mod:`kvcr_policy.cli.serve` parses the command line, loads the configuration and handles the
signals; a backend declares no command)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...config.loading import LoadedConfig
from .options import DATA_PORT, UNIX_PREFIX

__all__ = ["ServeSetup", "serve", "with_port"]


def with_port(listen: str | None) -> str | None:
    """``listen`` with :data:`~.options.DATA_PORT` added to a HOST given alone (``127.0.0.1``,
    ``localhost``, ``[::1]``); anything else as it is (a bad one is refused by the server)."""
    if listen is None:
        return None
    text = listen.strip()
    bracketed = text.startswith("[") and text.endswith("]")
    if text and not text.startswith(UNIX_PREFIX) and (bracketed or ":" not in text):
        return f"{text}:{DATA_PORT}"
    return listen


@dataclass(frozen=True, slots=True)
class ServeSetup:
    """What one ``serve`` runs: the loaded configuration and the command line's choices."""

    loaded: LoadedConfig
    #: ``HOST:PORT`` to listen on (None: ``transport.options.listen``).
    listen: str | None = None
    #: Seconds in-flight requests get when it stops (None: ``op_timeout_s``).
    grace: float | None = None
    #: ``HOST:PORT`` of /metrics (None: not served).
    metrics: str | None = None


def serve(
    setup: ServeSetup, stop: threading.Event, announce: Callable[[dict[str, Any]], None]
) -> None:
    """Check that a tier fits this host, start the server (and /metrics), ``announce`` where it
    listens (one dict: address, pid, secret, what it serves), and serve until ``stop`` is set;
    then stop the server, giving requests in flight ``setup.grace`` seconds."""
    import os

    from ...memory import preflight
    from ...observability.exposition import MetricsServer, check_public, serve_metrics
    from .server import fd_limit
    from .server.server import PeerServer

    loaded = setup.loaded
    preflight.check_placement(loaded.config.placement, loaded.origin(preflight.SETTING),
                              what="each tier that serve opens")  # fmt: skip
    if setup.metrics is not None:
        check_public(setup.metrics, loaded.config.observability.metrics_public)
    server = PeerServer(loaded, listen=with_port(setup.listen))
    soft, _ = fd_limit.raise_soft_limit()
    fd_limit.fit_sessions(
        len(server.keyring.names()),
        server.admission.tenant_max_sessions,
        loaded.origin("security.tenant_max_sessions"),
        soft,
    )
    if server.keyring.insecure:
        sys.stderr.write(
            "kvcr-policy serve: INSECURE: no authentication; every process that reaches "
            f"{server.host} can read, overwrite and delete every page\n"
        )
    # The metrics port is bound before the tier starts (a busy one is an error before anything
    # runs); /healthz answers from now on, /readyz once the server accepts clients.
    exposed: MetricsServer | None = None
    if setup.metrics is not None:
        exposed = serve_metrics(setup.metrics, ready=lambda: server.state == "open")
    try:
        server.start()
        line = {
            "listening": server.address,
            "pid": os.getpid(),
            "secret": server.keyring.source,
            "secret_created": str(server.keyring.created) if server.keyring.created else None,
            **server.describe(),
        }
        if exposed is not None:
            line["metrics"] = exposed.url
        announce(line)
        while not stop.wait(0.2):
            pass
    finally:
        server.stop(setup.grace)
        if exposed is not None:
            exposed.close()
