"""PoolMeter: what one pool of one pipeline records, per call or per batch, never per page.

The pipeline builds one :class:`PoolMeter` per registered pool, with every metric child bound
to its labels up front, so recording is a handful of ``inc``/``observe`` calls on objects
already resolved. Counts arrive already summed (numpy reductions, lengths), never page by page.

Gauges of levels (tier bytes, claims, placement) are changed by the difference from what this
meter last reported, not set: two pipelines with the same labels in one process then add up,
and :meth:`PoolMeter.close` takes back exactly what this meter added. When the last meter of
some labels closes, the tier is gone: its level series are removed from ``/metrics``, not
left at 0 (a fill of 0/0); its counters stay, as counters do, and so does the link limit
measured (a property of the link, which a scrape after a benchmark still reads).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..backends.reporting import LevelUsage
from .direction import DirectionMeter, Level
from .ledger import CallCounts, miss_reason
from .metrics import POOL_LABELS, Families

__all__ = ["DirectionMeter", "Level", "PoolMeter"]

# Open meters per (registry families, labels): the level series go when the last one closes.
_open_lock = threading.Lock()
_open: dict[tuple[int, tuple[str, ...]], int] = {}


class PoolMeter:
    """Every child one pool records into; see the module docstring."""

    def __init__(self, f: Families, backend: str, profile: str, pool: str) -> None:
        labels = (backend, profile, pool)
        self.restore = DirectionMeter(f, labels, "restore")
        self.store = DirectionMeter(f, labels, "store")
        self.seconds = {c: f.call_seconds.labels(*labels, c) for c in ("exists", "get", "set")}
        self.queried = f.keys_queried.labels(*labels)
        self.hit = f.keys_hit.labels(*labels)
        self.evictions = f.evictions.labels(*labels)
        self.claims = f.claims.labels(*labels)
        self._families = f
        # Tier bytes are made on the first usage report: a backend that cannot tell them (a
        # peer client's tier lives on the server, which exports it) shows none, not 0 of 0.
        self._tier: tuple[Level, Level] | None = None
        # Made on first report: a series of 0 would claim "no huge pages" or "no link" before
        # anything was audited or measured.
        self._huge: Level | None = None
        self._numa: dict[str, Level] = {}
        self._levels: dict[str, tuple[Level, Level, LevelUsage]] = {}
        self._base = 0.0  # the link limit probed or configured
        self._fastest = 0.0  # the fastest restore call's speed
        self._labels = labels
        self._admission: dict[tuple[str, str], Any] = {}
        self._evicted = 0
        self._lock = threading.Lock()
        self._closed = False
        with _open_lock:
            key = (id(f), labels)
            _open[key] = _open.get(key, 0) + 1

    def admission(self, admitted: int, reason: str, declined: int, why: str) -> None:
        """One lookup's admission: ``admitted`` pages reported for ``reason``, ``declined``
        present pages left to the engine for ``why``."""
        if admitted:
            self._admission_child("admitted", reason).inc(admitted)
        if declined:
            self._admission_child("declined", why).inc(declined)

    def _admission_child(self, decision: str, reason: str) -> Any:
        """The admission counter of ``decision`` and ``reason``, bound once (a lookup's
        decision is on the engine's scheduling path: no label lookup each time)."""
        child = self._admission.get((decision, reason))
        if child is None:
            family = self._families.admission_pages
            child = family.labels(*self._labels, decision, reason)
            self._admission[decision, reason] = child
        return child

    def direction(self, read: bool) -> DirectionMeter:
        return self.restore if read else self.store

    def exists(self, asked: int, found: int, seconds: float) -> None:
        self.queried.inc(asked)
        if found:
            self.hit.inc(found)
        self.seconds["exists"].observe(seconds)

    # ---- one get or set call ---------------------------------------------------------------

    def record(self, call: CallCounts, page_bytes: int, seconds: float) -> None:
        """A get or set call that ended (:class:`~.ledger.CallCounts`): its totals, latency and
        misses by reason.

        A call that raised misses every page it did not move, for the reason of its error.
        Otherwise keys past the transfer's ``limit`` miss for the backend's reason
        (``call.past``); within it, pages the mover did not get through miss for the reason of
        the batch that failed, or, where no batch raised, because the source said so (a read:
        ``absent``; a write: ``claimed``); a write's remaining failures (``keys - stored``
        beyond those) are keys another transfer held.
        """
        read = call.read
        side = self.direction(read)
        if read:
            self._restored(call.pages * page_bytes, seconds)
        # Seconds before bytes: a scrape between the two reads a speed too low, never too high.
        self.seconds["get" if read else "set"].observe(seconds)
        side.call(call, page_bytes)
        if call.error is not None:
            side.miss(miss_reason(call.error), call.keys - call.pages)
            return
        default = "absent" if read else "claimed"
        past = call.keys - call.limit
        side.miss(call.past or default, past)
        within = call.failure if call.fallback else default
        if read:
            side.miss(within, call.limit - call.pages)
            return
        side.miss(within, call.lost)
        side.miss(default, call.keys - call.stored - past - call.lost)

    def link_limit(self, bytes_per_second: float) -> None:
        """Export the link limit (bytes per second) of this pool: the one probed or configured,
        or the speed of a restore that beat it, whichever is larger (see :meth:`_restored`)."""
        with self._lock:
            self._base = float(bytes_per_second)
            self._families.link_limit.labels(*self._labels).set(max(self._base, self._fastest))

    def _restored(self, nbytes: int, seconds: float) -> None:
        """A restore call moved ``nbytes`` in ``seconds``: a speed above the link limit raises
        it. A probe is one copy; a restore overlaps several, so it can beat the probe, and a
        configured limit may be set low; the limit exported is then what the link was seen
        to do, and the share of it a dashboard shows (bytes over the seconds of the calls, a
        mean of the calls' speeds) never passes 1."""
        if nbytes <= 0 or seconds <= 0:
            return
        speed = nbytes / seconds
        with self._lock:
            if speed <= self._fastest:
                return
            self._fastest = speed
            if speed > self._base:
                self._families.link_limit.labels(*self._labels).set(speed)

    def probe(self, run: Callable[[], object], nbytes: int, runs: int = 1) -> None:
        """Time ``run()`` (a probe of ``nbytes``, one largest move) ``runs`` times; export the
        best rate as the link limit."""
        best = float("inf")
        for _ in range(runs):
            start = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - start)
        if 0 < best < float("inf"):
            self.link_limit(nbytes / best)

    # ---- levels ----------------------------------------------------------------------------

    def usage(self, tier: Any) -> None:
        """Tier capacity, bytes used and evictions from ``tier.usage()``, where it has one."""
        usage = getattr(tier, "usage", None)
        if usage is None:
            return
        now = usage()
        with self._lock:
            if self._tier is None:
                f = self._families
                self._tier = (Level(f.capacity.labels(*self._labels)),
                              Level(f.used.labels(*self._labels)))  # fmt: skip
            self._tier[0].update(now.capacity_bytes)
            self._tier[1].update(now.used_bytes)
            if now.evictions > self._evicted:
                self.evictions.inc(now.evictions - self._evicted)
                self._evicted = now.evictions
            for one in now.levels:
                self._level(one)

    def _level(self, now: LevelUsage) -> None:
        """One level of a tier of several: its bytes (levels), what it read (counters)."""
        f, labels = self._families, (*self._labels, now.name)
        if now.name not in self._levels:
            gauges = (Level(f.level_capacity.labels(*labels)), Level(f.level_used.labels(*labels)))
            self._levels[now.name] = (*gauges, LevelUsage(now.name, 0, 0, 0, 0.0, 0))
        capacity, used, last = self._levels[now.name]
        capacity.update(now.capacity_bytes)
        used.update(now.used_bytes)
        for family, grew in ((f.level_read_bytes, now.read_bytes - last.read_bytes),
                             (f.level_read_seconds, now.read_s - last.read_s),
                             (f.level_hits, now.hits - last.hits)):  # fmt: skip
            if grew > 0:
                family.labels(*labels).inc(grew)
        self._levels[now.name] = (capacity, used, now)

    def placement(self, audit: Mapping[str, Any]) -> None:
        """Huge-page bytes and pages per NUMA node from a placement audit's ``to_dict()``."""
        sampled = int(audit.get("numa_sampled_pages") or 0)
        total = int(audit.get("numa_total_pages") or 0)
        scale = total / sampled if sampled else 0.0
        with self._lock:
            if self._huge is None:
                self._huge = Level(self._families.huge_page_bytes.labels(*self._labels))
            self._huge.update(float(audit.get("huge_page_bytes") or 0))
            per_node = {str(k): v * scale for k, v in (audit.get("pages_per_node") or {}).items()}
            for node in set(self._numa) | set(per_node):
                level = self._numa.get(node)
                if level is None:
                    child = self._families.numa_pages.labels(*self._labels, node)
                    level = self._numa[node] = Level(child)
                level.update(per_node.get(node, 0.0))

    def remove(self) -> None:
        """Take back this meter's levels, then drop every series of its labels (a server's
        tier that closed: its series must not outlive it, nor make /metrics grow). Two meters
        of the same labels in one process share those series: remove one only when its pool
        is gone for both."""
        self.close()  # a multiprocess folder keeps series; their levels at least go back to 0
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            return  # prometheus-client cannot remove series there (it warns and does nothing)
        match = dict(zip(POOL_LABELS, self._labels, strict=True))
        for family in self._families.per_pool():
            family.remove_by_labels(match)

    def close(self) -> None:
        """Take back every level this meter added (the pool's tier is gone); the last meter
        of these labels to close removes their level series (idempotent)."""
        with self._lock:
            levels = [*(self._tier or ()), *self._numa.values()]
            levels += [gauge for capacity, used, _ in self._levels.values()
                       for gauge in (capacity, used)]  # fmt: skip
            for level in levels if self._huge is None else [*levels, self._huge]:
                level.update(0.0)
            if self._closed:
                return
            self._closed = True
        with _open_lock:
            key = (id(self._families), self._labels)
            left = _open[key] = _open[key] - 1
            if left:
                return
            del _open[key]
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
                return  # series cannot be removed there; the levels went back to 0
            f = self._families
            match = dict(zip(POOL_LABELS, self._labels, strict=True))
            for family in (f.capacity, f.used, f.claims, f.huge_page_bytes, f.numa_pages,
                           f.level_capacity, f.level_used):  # fmt: skip
                family.remove_by_labels(match)
