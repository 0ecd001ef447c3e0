"""A TCP forwarder between peer clients and a server, for tests that watch or cut the control
connection."""

from __future__ import annotations

import contextlib
import socket
import threading


class Proxy:
    """A TCP forwarder between clients and the server that logs each chunk's direction.

    ``drop``: its first ``drop`` connections are closed unread, as a server with its handshake
    slots full does to a handshake that has sent nothing yet; ``accepted`` counts them all.
    """

    def __init__(self, target: str, drop: int = 0) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.drop = drop
        self.accepted = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.events: list[str] = []  # "c" (client to server) or "s", in causal order
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            if self.accepted <= self.drop:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            for src, dst, tag in ((client, upstream, "c"), (upstream, client, "s")):
                threading.Thread(target=self._pump, args=(src, dst, tag), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, tag: str) -> None:
        try:
            while chunk := src.recv(1 << 16):
                with self.lock:  # recorded before it is forwarded: replies come after requests
                    self.events.append(tag)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (src, dst):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def mark(self) -> int:
        with self.lock:
            return len(self.events)

    def round_trips(self, since: int) -> int:
        """Requests answered since ``since``: runs of client chunks each followed by a reply."""
        with self.lock:
            events = "".join(self.events[since:])
        runs = [part for part in events.split("s") if part]
        assert events.endswith("s"), f"a request went unanswered: {events!r}"
        return len(runs)

    def close(self) -> None:
        self.listener.close()
