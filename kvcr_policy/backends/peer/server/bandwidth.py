"""TenantBandwidth: a token bucket per tenant on the bytes ``serve`` lets it read and write.

Opt-in (``security.tenant_rate``; unset: no limit, the upstream behaviour). Each claim
(a read) and reservation (a write) takes its pages' bytes from its tenant's bucket; the bucket
refills at the rate and holds at most :data:`BURST_S` seconds of it. When a take overdraws
the bucket, the answer to that request waits until the debt is paid (:meth:`delay`), on the
server's loop, never blocking it: one tenant cannot take the whole link, and a client's reads
and writes arrive no faster than its rate, over UCX and shared memory alike (a shared-memory
client copies only after the CLAIMED or RESERVED it waits for). The clock is injected; tests
drive the buckets with byte counts and their own clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["BURST_S", "TenantBandwidth", "TokenBucket"]

#: Seconds of its rate a bucket holds when full: a short burst, so that an idle tenant's
#: first requests are not paced, while a sustained stream is within one tenth of a second.
BURST_S = 0.1


class TokenBucket:
    """Bytes per second with a burst; :meth:`take` says how long the taker must wait."""

    __slots__ = ("_at", "_burst", "_clock", "_rate", "_tokens")

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        if not rate > 0 or not burst > 0:
            raise ValueError(f"a token bucket needs a positive rate and burst, got {rate}, {burst}")
        self._rate, self._burst, self._clock = rate, burst, clock
        self._tokens = burst
        self._at = clock()

    def take(self, nbytes: int) -> float:
        """Take ``nbytes`` (the bucket may go into debt); seconds until they are paid for."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = max(now, self._at)
        self._tokens -= nbytes
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate


class TenantBandwidth:
    """One bucket per tenant, made on its first request; ``rate`` None: no limit."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def delay(self, tenant: str, nbytes: int) -> float:
        """Seconds the answer to ``tenant``'s request of ``nbytes`` waits (0: at once). Called
        on the server's loop thread only (no lock)."""
        if self.rate is None or nbytes <= 0:
            return 0.0
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = TokenBucket(
                self.rate, self.rate * BURST_S, self._clock
            )
        return bucket.take(nbytes)
