"""Admission: who may hold a connection to the server, and how many bytes frames may buffer.

- **Handshakes.** At most :data:`MAX_HANDSHAKES` connections may be shaking hands at once;
  when one more arrives, one is dropped, not the newcomer: the oldest of those that have not
  even sent HELLO, else the oldest of those waiting to authenticate. A process that keeps
  hundreds of silent sockets open (or reopens them as their deadline closes them) only ever
  displaces its own, while a real client sends HELLO at once and finishes in milliseconds.
- **Sessions.** Authenticated sessions are capped in all (:data:`MAX_SESSIONS`) and per tenant
  (``security.tenant_max_sessions``): one tenant cannot take the others' places.
- **Buffered bytes.** A frame's payload is buffered whole before it is decoded; payloads over
  :data:`FREE_PAYLOAD` draw on a server-wide budget (:data:`MAX_BUFFERED`), so connections
  together cannot make the server hold more than that in partial frames.
- **Refusals** are logged, at most one line per second (a flood must not fill the disk).

Worker thread only.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

__all__ = ["FREE_PAYLOAD", "MAX_BUFFERED", "MAX_HANDSHAKES", "MAX_SESSIONS", "Admission"]

log = logging.getLogger("kvcr_policy.backends.peer.server")

MAX_SESSIONS = 256
MAX_HANDSHAKES = 64
#: Payloads up to this size need no budget (every request but large key and descriptor lists).
FREE_PAYLOAD = 64 << 10
MAX_BUFFERED = 256 << 20


class Admission:
    """See the module docstring."""

    def __init__(self, tenant_max_sessions: int, max_buffered: int = MAX_BUFFERED) -> None:
        self.tenant_max_sessions = tenant_max_sessions
        self.max_buffered = max_buffered
        self.buffered = 0
        self._handshakes: dict[Any, None] = {}  # no HELLO yet; insertion order: oldest first
        self._challenged: dict[Any, None] = {}  # HELLO answered, AUTH awaited
        self._sessions: dict[Any, str] = {}  # session -> tenant
        self._per_tenant: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()
        self._last_report = 0.0

    # ---- handshakes ------------------------------------------------------------------------

    def victim(self) -> Any | None:
        """When every handshake slot is taken: the connection to drop for a newcomer (the
        caller first reads what it sent: a client whose HELLO is waiting moves on instead)."""
        if len(self._handshakes) + len(self._challenged) < MAX_HANDSHAKES:
            return None
        return next(iter(self._handshakes or self._challenged))

    def arrived(self, session: Any) -> None:
        """Count a new connection as shaking hands (after :meth:`victim` made room)."""
        self._handshakes[session] = None

    def challenged(self, session: Any) -> None:
        """``session`` sent HELLO and got its CHALLENGE: it is dropped after silent ones."""
        if session in self._handshakes:
            del self._handshakes[session]
            self._challenged[session] = None

    def admit(self, session: Any, tenant: str) -> str | None:
        """Turn a handshake into a session of ``tenant``; why not, if it may not."""
        if len(self._sessions) >= MAX_SESSIONS:
            return f"this peer already serves {MAX_SESSIONS} sessions"
        if self._per_tenant[tenant] >= self.tenant_max_sessions:
            return (
                f"tenant {tenant!r} already holds {self._per_tenant[tenant]} sessions "
                f"(security.tenant_max_sessions = {self.tenant_max_sessions})"
            )
        self._handshakes.pop(session, None)
        self._challenged.pop(session, None)
        self._sessions[session] = tenant
        self._per_tenant[tenant] += 1
        return None

    def left(self, session: Any) -> None:
        self._handshakes.pop(session, None)
        self._challenged.pop(session, None)
        tenant = self._sessions.pop(session, None)
        if tenant is not None:
            self._per_tenant[tenant] -= 1
            if not self._per_tenant[tenant]:
                del self._per_tenant[tenant]

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    @property
    def handshakes(self) -> int:
        return len(self._handshakes) + len(self._challenged)

    def tenant_sessions(self, tenant: str) -> int:
        return self._per_tenant[tenant]

    # ---- buffered bytes --------------------------------------------------------------------

    def take(self, nbytes: int) -> bool:
        """Reserve ``nbytes`` of the frame budget; False (nothing taken) when it is spent."""
        if self.buffered + nbytes > self.max_buffered:
            return False
        self.buffered += nbytes
        return True

    def give(self, nbytes: int) -> None:
        self.buffered -= nbytes

    # ---- refusals --------------------------------------------------------------------------

    def refused(self, reason: str) -> None:
        """Log a refusal: the first of each second as it is, the rest counted into the next."""
        self._refused[reason] += 1
        now = time.monotonic()
        if now - self._last_report < 1.0:
            return
        self._last_report = now
        counts, self._refused = self._refused, Counter()
        for text, count in counts.items():
            times = f" ({count} times in the last second)" if count > 1 else ""
            log.warning("refused a connection: %s%s", text, times)
