"""A bounded HTTP endpoint for ``/metrics``, ``/healthz`` and ``/readyz``.

A process that serves a tier (``kvcr-policy serve``) must not be taken down through its
metrics port by anyone on the host. prometheus-client's own server
(:func:`~prometheus_client.start_http_server`) is a ``ThreadingHTTPServer``: a thread and a
descriptor per connection, no read deadline, no connection cap and a listen backlog of 5, so
1,100 half-sent requests took every descriptor under a 1,024 soft limit and a tenant could no
longer log in. This one is a single :mod:`asyncio` event loop in one thread (the standard
library's; no thread per connection) with:

- a deadline per connection (:data:`DEADLINE_S`, reading the request and writing the answer
  together): a client that sends half a request, or never reads the answer, is dropped;
- a connection cap (:data:`MAX_CONNECTIONS`): past it the oldest connection is dropped for the
  newest, so the descriptors it holds stay bounded and a scrape that arrives is answered;
- a request-head cap (:data:`MAX_HEAD`) and a listen backlog of :data:`BACKLOG`;
- only ``GET`` and ``HEAD``: ``/metrics`` (the exposition of the registry, in the format the
  scraper asks for: prometheus-client's :func:`~prometheus_client.exposition.choose_encoder`),
  ``/healthz`` (200 while the loop runs), ``/readyz`` (200 when ``ready()`` says so, else 503),
  404 for any other path.

The socket is bound when the object is made (:func:`bind`), so a busy port is an error before
the caller starts anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client.exposition import choose_encoder

from ..errors import ArgumentError
from ..memory.cpus import spread_thread

__all__ = ["BACKLOG", "DEADLINE_S", "MAX_CONNECTIONS", "MAX_HEAD", "HttpEndpoint", "bind"]

log = logging.getLogger("kvcr_policy.observability")

#: Seconds one connection may take to send its request and read the answer.
DEADLINE_S = 10.0
#: Connections held at once; the oldest is dropped for a new one past it.
MAX_CONNECTIONS = 32
#: Bytes of a request line and its headers.
MAX_HEAD = 8192
#: The listen backlog.
BACKLOG = 128

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}


def bind(host: str, port: int, where: str) -> socket.socket:
    """A listening TCP socket on ``host:port``; a clear :class:`ArgumentError` if it cannot be
    had (``where`` names the flag it came from)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as err:
        sock.close()
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        message = f"{where}: cannot listen on {shown}: {err.strerror or err}"
        if err.errno == errno.EADDRINUSE:
            message += "; expected a free port: another process holds it (pick another port)"
        raise ArgumentError(message) from None
    sock.setblocking(False)
    return sock


class HttpEndpoint:
    """Serves ``registry`` on ``sock`` from one thread until :meth:`close` (module docstring).
    ``ready`` answers ``/readyz`` (None: ready whenever live)."""

    def __init__(
        self, sock: socket.socket, registry: Any, ready: Callable[[], bool] | None = None
    ) -> None:
        self.sock = sock
        self.registry = registry
        self.ready = ready
        self.host, self.port = sock.getsockname()[:2]
        self._open: dict[asyncio.StreamWriter, None] = {}  # oldest first
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        started = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(started,),
            name=f"kvcr-metrics-http:{self.port}",  # one name per endpoint
            daemon=True,
        )
        self._thread.start()
        started.wait()

    def _run(self, started: threading.Event) -> None:
        spread_thread()
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(
                asyncio.start_server(
                    self._connection, sock=self.sock, backlog=BACKLOG, limit=MAX_HEAD
                )
            )
        finally:
            started.set()
        try:
            self._loop.run_forever()
        finally:
            self._server.close()
            for writer in list(self._open):
                writer.transport.abort()
            pending = asyncio.all_tasks(self._loop)
            for task in pending:  # connections still open: ended, not left pending
                task.cancel()
            gathered = asyncio.gather(*pending, return_exceptions=True)
            self._loop.run_until_complete(gathered)
            self._loop.run_until_complete(self._server.wait_closed())
            self._loop.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while len(self._open) >= MAX_CONNECTIONS:
            oldest = next(iter(self._open))
            del self._open[oldest]
            oldest.transport.abort()
        self._open[writer] = None
        try:
            await asyncio.wait_for(self._answer(reader, writer), DEADLINE_S)
        except (
            TimeoutError,
            OSError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ValueError,
        ):
            pass  # a slow, silent, oversize or broken client: dropped
        finally:
            self._open.pop(writer, None)
            writer.transport.abort()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if len(parts) != 3:
            status, body, kind = 400, b"bad request\n", "text/plain; charset=utf-8"
        else:
            status, body, kind = self._route(parts[0], parts[1].partition("?")[0], headers)
        reply = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode("latin-1")
        writer.write(reply if parts[0] == "HEAD" else reply + body)
        await writer.drain()

    def _route(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes, str]:
        text = "text/plain; charset=utf-8"
        if method not in ("GET", "HEAD"):
            return 405, b"GET or HEAD only\n", text
        if path == "/metrics":
            encoder, kind = choose_encoder(headers.get("accept", ""))
            return 200, encoder(self.registry), kind
        if path == "/healthz":
            return 200, b"ok\n", text
        if path == "/readyz":
            if self.ready is None or self.ready():
                return 200, b"ready\n", text
            return 503, b"not ready\n", text
        return 404, b"not found: /metrics, /healthz or /readyz\n", text

    def close(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            self.sock.close()
