"""Serving ``/metrics`` from a kvcr-policy process (``serve --metrics``, ``bench --metrics``).

The page is served by :class:`~.http.HttpEndpoint` (one bounded event loop in a daemon thread,
with ``/healthz`` and ``/readyz`` beside ``/metrics``; its docstring says why not
prometheus-client's threaded server). The address is loopback unless
the caller names another host: ``--metrics 9480`` listens on ``127.0.0.1:9480``,
``--metrics 0.0.0.0:9480`` on every interface, which :func:`check_public` refuses unless
``observability.metrics_public`` is true (as ``serve`` refuses ``--insecure`` off loopback).
Where ``PROMETHEUS_MULTIPROC_DIR`` is set (the process is one of several writing to that
folder), the page merges every process's values with prometheus-client's
:class:`~prometheus_client.multiprocess.MultiProcessCollector`, as SGLang's ``/metrics`` does.

A process that serves its own page leaves out the ``*_created`` series (one per counter and
histogram child: noise to a dashboard; prometheus-client's ``disable_created_metrics``), and
shows ``kvcr_policy_build_info`` from the start. A process whose page is its host's (SGLang's)
keeps the host's choice.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, disable_created_metrics

from ..config.hosts import host_part
from ..errors import ArgumentError
from ..values import shorten
from .http import HttpEndpoint, bind
from .metrics import families

__all__ = ["LOOPBACK", "MetricsServer", "check_public", "parse_listen", "serve_metrics"]

LOOPBACK = "127.0.0.1"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def parse_listen(text: str, where: str = "--metrics") -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[IPV6]:PORT`` -> (host, port); a bare port is loopback."""
    value = text.strip()
    host, sep, port_text = value.rpartition(":")
    if not sep:
        host, port_text = LOOPBACK, value
    if not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        message = (
            f"{where}: expected PORT, HOST:PORT or [IPV6]:PORT with a port from 0 to 65535 "
            f"(e.g. 9480 for 127.0.0.1:9480), got {shorten(text)}"
        )
        raise ArgumentError(message)
    try:
        return host_part(host, text=text, where=where), int(port_text)
    except ValueError as err:
        raise ArgumentError(str(err)) from None


def check_public(listen: str, public: bool, where: str = "--metrics") -> None:
    """Refuse a ``listen`` address other than loopback unless ``public``
    (``observability.metrics_public``): whoever reaches it reads every counter."""
    host, _ = parse_listen(listen, where)
    if public or host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass  # a host name other than localhost: not known to be loopback
    message = (
        f"{where} {shorten(listen)}: {host} is not loopback, so anyone who reaches it reads "
        "the counters (and the tier names); set observability.metrics_public = true "
        "(--set observability.metrics_public=true) to serve them there, or give a bare port "
        "for 127.0.0.1"
    )
    raise ArgumentError(message)


def _registry() -> Any:
    folder = os.environ.get(MULTIPROC_ENV)
    if not folder:
        return REGISTRY
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=folder)
    return registry


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it (idempotent)."""

    host: str
    port: int
    _endpoint: HttpEndpoint

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._endpoint.close()


def serve_metrics(
    listen: str,
    registry: CollectorRegistry | None = None,
    ready: Callable[[], bool] | None = None,
) -> MetricsServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` (``ready()``; None: always) on
    ``listen`` (see :func:`parse_listen`; port 0 picks one). The port is bound before this
    returns: a busy one is an :class:`ArgumentError` naming it."""
    host, port = parse_listen(listen)
    disable_created_metrics()
    if registry is None:
        families()  # the build info is there from the first scrape
    sock = bind(host, port, f"--metrics {shorten(listen)}")
    endpoint = HttpEndpoint(sock, registry or _registry(), ready)
    return MetricsServer(host, int(endpoint.port), endpoint)
