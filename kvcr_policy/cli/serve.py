"""``kvcr-policy serve``: run a peer tier until SIGTERM or SIGINT.

On start it prints one JSON line to stdout, ``{"listening": "HOST:PORT", "pid": ...}``, so
scripts and tests learn the port when ``--listen`` asks for port 0; the same is logged. The
line also says where the secret came from (``secret``) and, when ``serve`` had to create one,
the file it wrote (``secret_created``). With ``--metrics HOST:PORT`` it also serves
``/metrics``, ``/healthz`` and ``/readyz`` (the URL of ``/metrics`` is in that line,
``"metrics"``); ``--log-format json`` makes its log one JSON object per line.
A signal stops it cleanly (see
:meth:`~kvcr_policy.backends.peer.server.server.PeerServer.stop`) and it exits 0. The peer
runs it (:func:`kvcr_policy.backends.peer.serve.serve`); this module owns the command line,
the process's logging and its signals.

Secrets never come from this command line (its arguments are visible to every user of the
host): ``--insecure`` is the only authentication switch here.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import logging
import os
import signal
import sys
import threading
from typing import Annotated, Any

import typer

from ..observability.logs import LogFormat, configure
from .help import JsonOnly
from .numbers import Finite
from .options import overrides

__all__ = ["serve"]


def serve(
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen",
            "-l",
            help="HOST:PORT to listen on (default transport.options.listen: 127.0.0.1:7480; "
            "a HOST alone: port 7480; port 0: any free port).",
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile", "-p", help="Bundled profile name or path (else KVCR_POLICY_PROFILE)."
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="Override one value: KEY=VALUE."),
    ] = None,
    grace: Annotated[
        float | None,
        typer.Option(
            parser=Finite(0, 3600, "s"),
            help="Seconds in-flight requests get on SIGTERM (0..3600; default op_timeout_s).",
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="No authentication: any local process may read, overwrite and delete every "
            "page. Loopback only; clients must set security.insecure = true. For tests.",
        ),
    ] = False,
    tenant_rate: Annotated[
        str | None,
        typer.Option(
            "--tenant-rate",
            help="Most bytes per second each tenant's reads and writes may move, with a unit "
            "(e.g. 50MB/s); sets security.tenant_rate. Default: no limit.",
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(help="Logging level: debug, info, warning, error or critical.")
    ] = "info",
    log_format: Annotated[
        LogFormat,
        typer.Option(help="Log lines on stderr: text, or json (one object per line)."),
    ] = LogFormat.text,
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            help="Serve /metrics, /healthz and /readyz on HOST:PORT (a bare PORT listens on "
            "loopback).",
        ),
    ] = None,
    format: Annotated[
        JsonOnly, typer.Option("--format", "-f", help="Its report (one line) is JSON.")
    ] = JsonOnly.json,
) -> None:
    """Expose a DRAM tier to peers over UCX until SIGTERM (shared memory on one host, tcp else)."""
    from ..backends.peer.serve import ServeSetup
    from ..backends.peer.serve import serve as run
    from ..config.loading import load_config
    from ..observability.exposition import parse_listen

    configure(log_level, log_format)
    values: dict[str, Any] = dict(overrides(set_))
    if metrics is not None:
        parse_listen(metrics)  # a bad address is refused before anything starts
    if insecure:
        values["security.insecure"] = True
    if tenant_rate is not None:
        values["security.tenant_rate"] = tenant_rate
    # stdout carries the one JSON line only: UCX's own log (stdout by default) goes to stderr
    # with ours, so a supervisor that reads just that line never leaves UCX blocked on a full
    # pipe (a flush warning per close filled one and froze a server's worker thread).
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    setup = ServeSetup(load_config(profile=profile, overrides=values), listen, grace, metrics)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        logging.getLogger("kvcr_policy.backends.peer.server").info(
            "got %s", signal.Signals(signum).name
        )
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    # kill -USR1 PID: stacks to stderr (when stderr is a real file, not a captured stream).
    with contextlib.suppress(io.UnsupportedOperation, AttributeError, ValueError):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        run(setup, stop, _announce)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _announce(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line, default=str) + "\n")
    sys.stdout.flush()
