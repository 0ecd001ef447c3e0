"""The frame budget: bytes of partial frames the server buffers, shared fairly between tenants.

A frame's payload is buffered whole before it is decoded; payloads over :data:`FREE_PAYLOAD`
draw on one server-wide budget of :data:`MAX_BUFFERED` bytes, so connections together cannot
make the server hold more than that in partial frames.

The budget is charged with the bytes that arrived, never with the length a header declares
(a header that declares 16 MiB and sends one byte holds one byte), and shared fairly: of the
tenants holding or asking for it, none may hold more than an equal share while another asks,
and a tenant under its share takes what it needs from frames of tenants over theirs. A frame
that gets no budget is refused alone: its bytes are dropped as they arrive, its request is
answered ERROR ``CAPACITY``, and the connection goes on.

Worker thread only.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

__all__ = ["FREE_PAYLOAD", "MAX_BUFFERED", "FrameBudget", "Holder"]

#: Payloads up to this size need no budget (every request but large key and descriptor lists).
FREE_PAYLOAD = 64 << 10
MAX_BUFFERED = 256 << 20


class Holder(Protocol):
    """A connection that holds frame budget: told to give it back when preempted."""

    def preempt(self) -> None:
        """Drop the frame in progress and give back every byte of budget it holds."""


class FrameBudget:
    """Bytes of partial frames, shared fairly between tenants (see the module docstring).

    ``tenant`` is None for a connection that has not authenticated (its frames are small)."""

    def __init__(self, limit: int = MAX_BUFFERED) -> None:
        self.limit = limit
        self.total = 0
        self._held: dict[Holder, int] = {}
        self._tenant: dict[Holder, str | None] = {}
        self._by_tenant: Counter[str | None] = Counter()

    def held(self, tenant: str | None) -> int:
        return self._by_tenant[tenant]

    def share(self, tenant: str | None) -> int:
        """The most ``tenant`` may hold while the tenants holding budget now ask for theirs."""
        active = {t for t, n in self._by_tenant.items() if n} | {tenant}
        return self.limit // len(active)

    def take(self, holder: Holder, tenant: str | None, nbytes: int) -> bool:
        """Charge ``nbytes`` more to ``holder``; False (nothing charged) when ``tenant`` would
        hold more than its share, or when the tenants over theirs cannot make room."""
        share = self.share(tenant)
        if self._by_tenant[tenant] + nbytes > share:
            return False
        if self.total + nbytes > self.limit:
            self._make_room(self.total + nbytes - self.limit, share)
            if self.total + nbytes > self.limit:
                return False
        self._held[holder] = self._held.get(holder, 0) + nbytes
        self._tenant[holder] = tenant
        self._by_tenant[tenant] += nbytes
        self.total += nbytes
        return True

    def give(self, holder: Holder, nbytes: int) -> None:
        left = self._held.get(holder, 0) - nbytes
        tenant = self._tenant.get(holder)
        self._by_tenant[tenant] -= nbytes
        if not self._by_tenant[tenant]:
            del self._by_tenant[tenant]
        self.total -= nbytes
        if left > 0:
            self._held[holder] = left
        else:
            self._held.pop(holder, None)
            self._tenant.pop(holder, None)

    def _make_room(self, needed: int, share: int) -> None:
        """Preempt frames of tenants holding more than ``share``, largest first, until
        ``needed`` bytes are free (or none is over its share)."""
        over = [
            (n, holder)
            for holder, n in self._held.items()
            if self._by_tenant[self._tenant[holder]] > share
        ]
        for n, holder in sorted(over, key=lambda item: -item[0]):
            if needed <= 0:
                return
            if self._by_tenant[self._tenant[holder]] <= share:
                continue  # its tenant came down to its share already
            holder.preempt()
            needed -= n
