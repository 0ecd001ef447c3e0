"""``kvcr-policy serve``: run a peer tier until SIGTERM or SIGINT.

On start it prints one JSON line to stdout, ``{"listening": "HOST:PORT", "pid": ...}``, so
scripts and tests learn the port when ``--listen`` asks for port 0; the same is logged. The
line also says where the secret came from (``secret``) and, when ``serve`` had to create one,
the file it wrote (``secret_created``). With ``--metrics HOST:PORT`` it also serves
``/metrics`` (its URL is in that line, ``"metrics"``). A signal stops it cleanly (see
:meth:`PeerServer.stop`) and it exits 0.

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

from kvcr_policy.cli_help import JsonOnly
from kvcr_policy.cli_numbers import Finite
from kvcr_policy.values import shorten

__all__ = ["register", "serve_command"]


def serve_command(
    listen: Annotated[
        str | None,
        typer.Option(
            "--listen",
            "-l",
            help="HOST:PORT to listen on (default transport.options.listen: 127.0.0.1:0).",
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
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "info",
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics", help="Serve /metrics on HOST:PORT (a bare PORT listens on loopback)."
        ),
    ] = None,
    format: Annotated[
        JsonOnly, typer.Option("--format", "-f", help="Its report (one line) is JSON.")
    ] = JsonOnly.json,
) -> None:
    """Expose a DRAM tier to peers over UCX until SIGTERM (shared memory on one host, tcp else)."""
    from kvcr_policy.loading import load_config
    from kvcr_policy.memory import preflight
    from kvcr_policy.observability.exposition import (
        MetricsServer,
        check_public,
        parse_listen,
        serve_metrics,
    )

    from .server.server import PeerServer

    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    overrides: dict[str, Any] = {}
    for pair in set_ or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {shorten(pair)}", param_hint="--set")
        overrides[key.strip()] = value
    if metrics is not None:
        parse_listen(metrics)  # a bad address is refused before anything starts
    if insecure:
        overrides["security.insecure"] = True
    # stdout carries the one JSON line only: UCX's own log (stdout by default) goes to stderr
    # with ours, so a supervisor that reads just that line never leaves UCX blocked on a full
    # pipe (a flush warning per close filled one and froze a server's worker thread).
    os.environ.setdefault("UCX_LOG_FILE", "stderr")
    loaded = load_config(profile=profile, overrides=overrides)
    preflight.check_placement(loaded.config.placement, loaded.origin(preflight.SETTING),
                              what="each tier that serve opens")  # fmt: skip
    if metrics is not None:
        check_public(metrics, loaded.config.observability.metrics_public)
    server = PeerServer(loaded, listen=listen)
    exposed: MetricsServer | None = None
    if server.keyring.insecure:
        sys.stderr.write(
            "kvcr-policy serve: INSECURE: no authentication; every process that reaches "
            f"{server.host} can read, overwrite and delete every page\n"
        )
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
        server.start()
        if metrics is not None:
            exposed = serve_metrics(metrics)
        line = {
            "listening": server.address,
            "pid": os.getpid(),
            "secret": server.keyring.source,
            "secret_created": str(server.keyring.created) if server.keyring.created else None,
            **server.describe(),
        }
        if exposed is not None:
            line["metrics"] = exposed.url
        sys.stdout.write(json.dumps(line, default=str) + "\n")
        sys.stdout.flush()
        while not stop.wait(0.2):
            pass
    finally:
        server.stop(grace)
        if exposed is not None:
            exposed.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the ``kvcr-policy`` app."""
    app.command("serve")(serve_command)
