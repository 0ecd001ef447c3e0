"""The ``kvcr_policy_*`` metric families, built with prometheus-client, once per registry.

Every family is created once per :class:`~prometheus_client.CollectorRegistry` (the default
registry unless a caller passes another) and shared by every pipeline of the process, so two
pipelines never register a name twice. Labels stay few and bounded: ``backend``, ``profile``
and ``pool`` on everything a pipeline records, plus ``direction`` (``restore`` | ``store``),
``call`` (``exists`` | ``get`` | ``set``), ``reason`` (:data:`MISS_REASONS`), ``node`` (NUMA
node of the placement audit) and, for the peer server, ``kind``.

``kvcr_policy_build_info`` (value 1) names the ``version`` of kvcr-policy and the ``python``
that runs it, once per process (a process may run several backends: each series names its own
``backend``).

Multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, as SGLang sets it for ``--enable-metrics``):
prometheus-client then keeps every value in a file of that folder and the process serving
``/metrics`` merges them; counters and histograms add up across processes, and each gauge says
how it combines: levels (tier bytes, claims, placement) are summed over live processes, so a
host's ranks add up; the link limit is the largest any process measured.
"""

from __future__ import annotations

import logging
import platform
import threading
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

__all__ = [
    "BYTE_BUCKETS",
    "LATENCY_BUCKETS",
    "MISS_REASONS",
    "POOL_LABELS",
    "Families",
    "families",
]

log = logging.getLogger("kvcr_policy.observability")

#: Labels of everything a pipeline records: which backend, which profile, which pool.
POOL_LABELS: Final = ("backend", "profile", "pool")

#: Why a page did not move. ``absent``: never stored (or deleted); ``evicted``: stored, then
#: evicted; ``claimed``: no slot could be had, every candidate held by transfers in flight;
#: ``transport_error``: its batch failed and the fallback did not recover it;
#: ``pool_refused``: the pool (or the call's indices) was refused; ``backend_unavailable``:
#: the tier could not be reached (peer gone, backend closed).
MISS_REASONS: Final = (
    "absent",
    "evicted",
    "claimed",
    "transport_error",
    "pool_refused",
    "backend_unavailable",
)

#: Call latency buckets: 100 µs to 30 s.
LATENCY_BUCKETS: Final = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip

#: Bytes in flight, 1 MiB to 64 GiB in powers of four.
BYTE_BUCKETS: Final = tuple(float(1 << (20 + 2 * i)) for i in range(9))

#: Batches in flight.
BATCH_BUCKETS: Final = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 64.0)


@dataclass(frozen=True, slots=True)
class Families:
    """Every ``kvcr_policy_*`` family of one registry."""

    pages: Counter
    bytes: Counter
    call_seconds: Histogram
    keys_queried: Counter
    keys_hit: Counter
    descriptors_before: Counter
    descriptors_coalesced: Counter
    descriptors_split: Counter
    batches: Counter
    inflight_batches: Histogram
    inflight_bytes: Histogram
    fallback_pages: Counter
    misses: Counter
    evictions: Counter
    admission_pages: Counter
    claims: Gauge
    capacity: Gauge
    used: Gauge
    level_capacity: Gauge
    level_used: Gauge
    level_read_bytes: Counter
    level_read_seconds: Counter
    level_hits: Counter
    huge_page_bytes: Gauge
    numa_pages: Gauge
    link_limit: Gauge
    peer_connections: Gauge
    peer_requests: Counter
    peer_rejected: Counter
    peer_auth_failures: Counter
    peer_hits: Counter
    peer_misses: Counter
    peer_served_bytes: Counter
    peer_stored_bytes: Counter
    build_info: Gauge

    def per_pool(self) -> list[Any]:
        """The families labelled by :data:`POOL_LABELS` first (all but the peer server's and
        the build info)."""
        return [
            getattr(self, f)
            for f in self.__dataclass_fields__
            if not f.startswith("peer_") and f != "build_info"
        ]


def _version() -> str:
    try:
        return version("kvcr-policy")
    except PackageNotFoundError:  # pragma: no cover - a source tree never installed
        return "unknown"


def _build_info(registry: CollectorRegistry) -> Gauge:
    info = Gauge(
        "kvcr_policy_build_info",
        "kvcr-policy's version and the Python running it (always 1).",
        ("version", "python"),
        registry=registry,
        multiprocess_mode="max",
    )
    info.labels(_version(), platform.python_version()).set(1)
    return info


def _build(registry: CollectorRegistry) -> Families:
    pool = POOL_LABELS
    moved = (*pool, "direction")
    of_level = (*pool, "level")
    kw: dict[str, Any] = {"registry": registry}
    # Levels add up over a host's processes; see the module docstring.
    level: dict[str, Any] = {"registry": registry, "multiprocess_mode": "livesum"}
    return Families(
        pages=Counter(
            "kvcr_policy_pages", "Pages moved (restored or stored) that arrived.", moved, **kw
        ),
        bytes=Counter(
            "kvcr_policy_bytes", "Bytes of the pages moved (restored or stored).", moved, **kw
        ),
        call_seconds=Histogram(
            "kvcr_policy_call_duration_seconds",
            "Duration of exists, get and set calls of the pipeline.",
            (*pool, "call"),
            buckets=LATENCY_BUCKETS,
            **kw,
        ),
        keys_queried=Counter(
            "kvcr_policy_metadata_keys_queried", "Keys asked for by exists calls.", pool, **kw
        ),
        keys_hit=Counter(
            "kvcr_policy_metadata_keys_hit",
            "Keys exists calls found present (the leading run).",
            pool,
            **kw,
        ),
        descriptors_before=Counter(
            "kvcr_policy_descriptors_before_coalescing",
            "Transfer descriptors before coalescing: one per fragment of each page.",
            moved,
            **kw,
        ),
        descriptors_coalesced=Counter(
            "kvcr_policy_descriptors_after_coalescing",
            "Transfer descriptors after coalescing, before the split.",
            moved,
            **kw,
        ),
        descriptors_split=Counter(
            "kvcr_policy_descriptors_after_split",
            "Transfer descriptors handed to the backend (after coalescing and split).",
            moved,
            **kw,
        ),
        batches=Counter("kvcr_policy_batches", "Batches submitted to the backend.", moved, **kw),
        inflight_batches=Histogram(
            "kvcr_policy_window_inflight_batches",
            "Batches in flight (this one included) each time a batch is submitted.",
            moved,
            buckets=BATCH_BUCKETS,
            **kw,
        ),
        inflight_bytes=Histogram(
            "kvcr_policy_window_inflight_bytes",
            "Bytes in flight (this batch included) each time a batch is submitted.",
            moved,
            buckets=BYTE_BUCKETS,
            **kw,
        ),
        fallback_pages=Counter(
            "kvcr_policy_fallback_pages",
            "Pages of failed batches handed to the fallback strategy (retried page by page).",
            (*moved, "reason"),
            **kw,
        ),
        misses=Counter(
            "kvcr_policy_misses",
            "Pages asked for that did not move, by reason.",
            (*moved, "reason"),
            **kw,
        ),
        evictions=Counter("kvcr_policy_evictions", "Pages evicted from the tier.", pool, **kw),
        admission_pages=Counter(
            "kvcr_policy_admission_pages",
            "Present pages a lookup reported as hits (decision 'admitted') or left to the "
            "engine to compute ('declined'), by the admission strategy's reason.",
            (*pool, "decision", "reason"),
            **kw,
        ),
        claims=Gauge(
            "kvcr_policy_claims_outstanding",
            "Tier pages claimed by restores in flight.",
            pool,
            **level,
        ),
        capacity=Gauge(
            "kvcr_policy_tier_capacity_bytes", "Bytes of the tier, page slots only.", pool, **level
        ),
        used=Gauge(
            "kvcr_policy_tier_used_bytes", "Bytes of the tier's slots in use.", pool, **level
        ),
        # The levels of a tier of several (the cascade's dram and file); see TierUsage.
        level_capacity=Gauge(
            "kvcr_policy_tier_level_capacity_bytes",
            "Bytes of one level of the tier.",
            of_level,
            **level,
        ),
        level_used=Gauge(
            "kvcr_policy_tier_level_used_bytes",
            "Bytes of one level of the tier in use.",
            of_level,
            **level,
        ),
        level_read_bytes=Counter(
            "kvcr_policy_tier_level_read_bytes",
            "Bytes restores read from one level.",
            of_level,
            **kw,
        ),
        level_read_seconds=Counter(
            "kvcr_policy_tier_level_read_seconds",
            "Seconds of the restores that read from one level (its rate: bytes over these).",
            of_level,
            **kw,
        ),
        level_hits=Counter(
            "kvcr_policy_tier_level_hits", "Pages restores found on one level.", of_level, **kw
        ),
        huge_page_bytes=Gauge(
            "kvcr_policy_placement_huge_page_bytes",
            "Tier bytes backed by huge pages (placement audit, /proc/self/smaps).",
            pool,
            **level,
        ),
        numa_pages=Gauge(
            "kvcr_policy_placement_numa_pages",
            "Tier pages per NUMA node (placement audit, move_pages(2) sample scaled to the "
            "region); node 'not_present' for pages not yet faulted in.",
            (*pool, "node"),
            **level,
        ),
        link_limit=Gauge(
            "kvcr_policy_link_limit_bytes_per_second",
            "The link limit: the backend's largest single tier -> pool move, measured (probe) "
            "or configured (observability.link_limit_gbps), or a restore call's speed where "
            "one was faster.",
            pool,
            registry=registry,
            multiprocess_mode="max",
        ),
        peer_connections=Gauge(
            "kvcr_policy_peer_connections",
            "Client connections a peer server holds open.",
            ("backend", "profile"),
            **level,
        ),
        peer_requests=Counter(
            "kvcr_policy_peer_requests",
            "Requests a peer server answered, by kind.",
            ("backend", "profile", "kind"),
            **kw,
        ),
        peer_rejected=Counter(
            "kvcr_policy_peer_rejected_frames",
            "Frames a peer server rejected (malformed, truncated, oversize), by reason.",
            ("backend", "profile", "reason"),
            **kw,
        ),
        peer_auth_failures=Counter(
            "kvcr_policy_peer_auth_failures",
            "Connections a peer server refused at authentication, by reason (no_secret, "
            "wrong_secret, bad_proof); each is logged with the client's address.",
            ("backend", "profile", "reason"),
            **kw,
        ),
        peer_hits=Counter(
            "kvcr_policy_peer_hits",
            "Keys a peer server's tier held when a client claimed them (reads).",
            pool,
            **kw,
        ),
        peer_misses=Counter(
            "kvcr_policy_peer_misses",
            "Keys a client claimed that a peer server's tier did not hold.",
            pool,
            **kw,
        ),
        peer_served_bytes=Counter(
            "kvcr_policy_peer_served_bytes",
            "Bytes of pages a peer server sent to clients (reads that completed).",
            pool,
            **kw,
        ),
        peer_stored_bytes=Counter(
            "kvcr_policy_peer_stored_bytes",
            "Bytes of pages clients stored on a peer server (committed writes).",
            pool,
            **kw,
        ),
        build_info=_build_info(registry),
    )


_lock = threading.Lock()
_built: dict[int, tuple[CollectorRegistry, Families]] = {}


def families(registry: CollectorRegistry | None = None) -> Families:
    """The families of ``registry`` (the default registry when None), created on first use."""
    registry = REGISTRY if registry is None else registry
    with _lock:
        entry = _built.get(id(registry))
        if entry is None or entry[0] is not registry:
            entry = (registry, _build(registry))
            _built[id(registry)] = entry
        return entry[1]
