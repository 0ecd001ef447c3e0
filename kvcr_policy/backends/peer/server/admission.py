"""Admission: who may hold a connection to the server, and how many bytes frames may buffer.

- **Handshakes.** At most :data:`MAX_HANDSHAKES` connections may be shaking hands at once, and
  at most :data:`MAX_HANDSHAKES_PER_ADDRESS` from one address; when one more arrives, one is
  dropped, not the newcomer: first those that have not even sent HELLO, then those whose HELLO
  named a key id the server does not know, last those that named a known one (a client that
  holds a secret); among equals, one from the address that holds the most handshakes, its
  oldest first. A newcomer from an address at its own limit displaces one of that address. So
  a process that floods silent sockets, or HELLOs with made-up key ids, only ever displaces its
  own, while a real client's handshake, which names its tenant's key id, is dropped only for
  another that does (red team 2026-12-b, B9: such a flood pushed out a legitimate handshake).
- **Sessions.** Authenticated sessions are capped in all (:data:`MAX_SESSIONS`) and per tenant
  (``security.tenant_max_sessions``): one tenant cannot take the others' places.
- **Buffered bytes.** Payloads over :data:`~.budget.FREE_PAYLOAD` draw on the server-wide
  frame budget, shared fairly between tenants (:mod:`.budget`).
- **Refusals** are logged, at most one line per second (a flood must not fill the disk).

Worker thread only.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

__all__ = ["MAX_HANDSHAKES", "MAX_HANDSHAKES_PER_ADDRESS", "MAX_SESSIONS", "Admission"]

from .budget import MAX_BUFFERED, FrameBudget

log = logging.getLogger("kvcr_policy.backends.peer.server")

MAX_SESSIONS = 256
MAX_HANDSHAKES = 64
#: Handshakes one address may hold: half the slots, room for every rank of a host at start.
MAX_HANDSHAKES_PER_ADDRESS = 32
# Who is dropped first when handshake slots are full (see the module docstring).
_SILENT, _UNKNOWN_KEY, _KNOWN_KEY = 0, 1, 2


class Admission:
    """See the module docstring."""

    def __init__(self, tenant_max_sessions: int, max_buffered: int = MAX_BUFFERED) -> None:
        self.tenant_max_sessions = tenant_max_sessions
        self.budget = FrameBudget(max_buffered)
        # Connections shaking hands -> (rank, address); insertion order: oldest first.
        self._pending: dict[Any, tuple[int, str]] = {}
        self._by_address: Counter[str] = Counter()
        self._sessions: dict[Any, str] = {}  # session -> tenant
        self._per_tenant: Counter[str] = Counter()
        self._refused: Counter[str] = Counter()
        self._last_report = 0.0

    # ---- handshakes ------------------------------------------------------------------------

    def victim(self, address: str) -> Any | None:
        """The handshake to drop for a newcomer from ``address``, when every slot (or every
        slot that address may hold) is taken (the caller first reads what the victim sent: a
        client whose HELLO is waiting moves up instead)."""
        crowded = self._by_address[address] >= MAX_HANDSHAKES_PER_ADDRESS
        if len(self._pending) < MAX_HANDSHAKES and not crowded:
            return None
        rivals = [
            (rank, -self._by_address[where], age, session)
            for age, (session, (rank, where)) in enumerate(self._pending.items())
            if not crowded or where == address
        ]
        return min(rivals, key=lambda rival: rival[:3])[3]

    def arrived(self, session: Any, address: str) -> None:
        """Count a new connection from ``address`` as shaking hands (after :meth:`victim`
        made room)."""
        self._pending[session] = (_SILENT, address)
        self._by_address[address] += 1

    def challenged(self, session: Any, known: bool) -> None:
        """``session`` sent HELLO and got its CHALLENGE; ``known``: its key id is a tenant's."""
        if session in self._pending:
            address = self._pending[session][1]
            self._pending[session] = (_KNOWN_KEY if known else _UNKNOWN_KEY, address)

    def _done_shaking(self, session: Any) -> None:
        entry = self._pending.pop(session, None)
        if entry is not None:
            self._by_address[entry[1]] -= 1
            if not self._by_address[entry[1]]:
                del self._by_address[entry[1]]

    def admit(self, session: Any, tenant: str) -> str | None:
        """Turn a handshake into a session of ``tenant``; why not, if it may not."""
        if len(self._sessions) >= MAX_SESSIONS:
            return f"this peer already serves {MAX_SESSIONS} sessions"
        if self._per_tenant[tenant] >= self.tenant_max_sessions:
            return (
                f"tenant {tenant!r} already holds {self._per_tenant[tenant]} sessions "
                f"(security.tenant_max_sessions = {self.tenant_max_sessions})"
            )
        self._done_shaking(session)
        self._sessions[session] = tenant
        self._per_tenant[tenant] += 1
        return None

    def left(self, session: Any) -> None:
        self._done_shaking(session)
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
        return len(self._pending)

    def tenant_sessions(self, tenant: str) -> int:
        return self._per_tenant[tenant]

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
