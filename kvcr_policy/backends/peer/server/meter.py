"""ServerMeter: what a peer server (``kvcr-policy serve``) records, per request, never per page.

Connections it holds open, requests answered by kind (the wire's message kinds: a bounded
set), failed authentications by reason (:data:`AUTH_REASONS`), frames rejected by reason
(``malformed``: the frame or its payload did not decode;
``unexpected``: a well-formed message out of order or not a client request), and, per tier it
serves, the same tier gauges a pipeline exports (capacity, bytes used, claims, evictions) under
``backend="peer-server"``, and its own counters: keys claimed found and not found
(``kvcr_policy_peer_hits``, ``_misses``: the store's counts), bytes served to clients and
stored by them (``kvcr_policy_peer_served_bytes``, ``_stored_bytes``: pages of reads and
writes that completed, times the tier's page size). Those follow the tier's store: it calls
back after every change of
its slots (a claim granted or released, on a SEND's completion, its expiry or the session's
end; a slot reserved, written, aborted, deleted or evicted), so a scrape reads the tier as it
is, not as the last request left it. A store without :meth:`~...dram.store.Store.watch` (one a
placement plugin built) is refreshed after each request that names its tier.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry

from kvcr_policy.errors import ClosedError
from kvcr_policy.observability.meter import Level, PoolMeter
from kvcr_policy.observability.metrics import families

__all__ = ["AUTH_REASONS", "BACKEND", "REJECT_REASONS", "ServerMeter", "open_server_meter"]

log = logging.getLogger("kvcr_policy.observability")

BACKEND = "peer-server"
REJECT_REASONS = ("malformed", "unexpected")
#: Why a client failed to authenticate. ``no_secret``: it sent no key id; ``wrong_secret``:
#: its key id is no tenant's (another secret); ``bad_proof``: a tenant's key id with a proof
#: that does not match it, the nonces and the UCX address it sent (a replay or a forgery).
AUTH_REASONS = ("no_secret", "wrong_secret", "bad_proof")


class ServerMeter:
    """The children of one peer server (labels ``backend="peer-server"`` and its profile)."""

    def __init__(self, profile: str, kinds: list[str], registry: CollectorRegistry | None = None):
        f = families(registry)
        self._families = f
        self.profile = profile
        self.connections = f.peer_connections.labels(BACKEND, profile)
        self.requests = {kind: f.peer_requests.labels(BACKEND, profile, kind) for kind in kinds}
        self.rejected = {r: f.peer_rejected.labels(BACKEND, profile, r) for r in REJECT_REASONS}
        self.auth_failures = {
            r: f.peer_auth_failures.labels(BACKEND, profile, r) for r in AUTH_REASONS
        }
        self._tiers: dict[int, _Tier] = {}  # by tier: labels may repeat
        self._lock = threading.Lock()
        self._open = 0

    def connected(self) -> None:
        with self._lock:
            self._open += 1
        self.connections.inc()

    def disconnected(self) -> None:
        with self._lock:
            self._open -= 1
        self.connections.dec()

    def request(self, kind: str) -> None:
        child = self.requests.get(kind)
        if child is not None:
            child.inc()

    def reject(self, reason: str) -> None:
        self.rejected[reason].inc()

    def auth_failure(self, reason: str) -> None:
        self.auth_failures[reason].inc()

    def tier(self, tier: Any) -> None:
        """Refresh the gauges of ``tier`` (a server tier with ``name``, ``usage()`` and
        ``store``) and count its new evictions; the first call also watches its store."""
        with self._lock:
            entry = self._tiers.get(id(tier))
            if entry is None:
                entry = self._tiers[id(tier)] = _Tier(self._families, self.profile, tier.name)
                watch = getattr(tier.store, "watch", None)
                if watch is not None:
                    watch(lambda: self._refresh(tier))
        self._refresh(tier)

    def _refresh(self, tier: Any) -> None:
        # Under the lock, so the last change read is the last one set (two threads change
        # stores: the worker and the tier opener); a closed store keeps its last values.
        with self._lock:
            entry = self._tiers.get(id(tier))
            if entry is None or getattr(tier.store, "closed", False):
                return
            try:
                entry.meter.usage(tier)
                entry.update(tier.store.stats())
            except ClosedError:
                return

    def moved(self, tier: Any, read: bool, pages: int) -> None:
        """``pages`` of ``tier`` were sent to a client (``read``) or stored by one."""
        entry = self._tiers.get(id(tier))
        if entry is not None and pages > 0:
            nbytes = pages * int(tier.geometry.page_bytes)
            (entry.served if read else entry.stored).inc(nbytes)

    def close(self) -> None:
        """Take back what this server added to the levels (its connections), and drop its
        tiers' series: they are the server's alone (labels name its tiers)."""
        with self._lock:
            for entry in self._tiers.values():
                entry.remove()
            self._tiers.clear()
            open_, self._open = self._open, 0
        if open_:
            self.connections.dec(open_)


class _Tier:
    """The series of one tier of the server, and the store counts last read."""

    def __init__(self, f: Any, profile: str, name: str) -> None:
        labels = (BACKEND, profile, name)
        self.meter = PoolMeter(f, *labels)
        self.claims = Level(self.meter.claims)
        self._families = [f.peer_hits, f.peer_misses, f.peer_served_bytes, f.peer_stored_bytes]
        self._labels = labels
        self.hits, self.misses, self.served, self.stored = (
            family.labels(*labels) for family in self._families
        )
        self._seen = (0, 0)

    def update(self, stats: Any) -> None:
        self.claims.update(stats.claimed)
        # A placement plugin's store may count neither: its tier then shows no hits or misses.
        now = (int(getattr(stats, "hits", 0)), int(getattr(stats, "misses", 0)))
        for child, seen, count in zip((self.hits, self.misses), self._seen, now, strict=True):
            if count > seen:
                child.inc(count - seen)
        self._seen = (max(self._seen[0], now[0]), max(self._seen[1], now[1]))

    def remove(self) -> None:
        self.meter.remove()
        for family in self._families:
            with contextlib.suppress(KeyError):
                family.remove(*self._labels)


def open_server_meter(enabled: bool, profile: str, kinds: list[str]) -> ServerMeter | None:
    """A server meter, or None with metrics off (or when they cannot be kept: logged)."""
    if not enabled:
        return None
    try:
        return ServerMeter(profile, kinds)
    except (OSError, ValueError) as err:
        log.warning("kvcr_policy metrics of the peer server are off: %s", err)
        return None
