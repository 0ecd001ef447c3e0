"""The optional reporting members of a backend, asked for where they exist.

:class:`PoolReporting` and :class:`BackendReporting` are not part of the data path: a backend
implements the ones it can. The pipeline and the meters ask
through these functions, so a backend without them still moves pages: no stats of its own
(``{}``), no audit (``None``), no usage gauges, and probes (``kvcr-policy bench``'s limits of a
restore and a store) that say it has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import UnsupportedError

__all__ = [
    "BackendReporting",
    "LevelUsage",
    "PoolReporting",
    "TierUsage",
    "audit_of",
    "describe",
    "probe",
    "probe_store",
    "stats_of",
]


@dataclass(frozen=True, slots=True)
class LevelUsage:
    """One level of a tier of several (the ``cascade``'s ``dram`` and ``file``): what it holds
    now, and what its restores read since it opened (bytes, hits and the seconds they took:
    bytes over seconds is its restore rate)."""

    name: str
    capacity_bytes: int
    used_bytes: int
    read_bytes: int
    read_s: float
    hits: int


@dataclass(frozen=True, slots=True)
class TierUsage:
    """What one pool's tier holds now, for the metrics (``PoolTier.usage()``, optional)."""

    capacity_bytes: int
    used_bytes: int
    #: Pages evicted since the tier opened.
    evictions: int
    #: Each level's figures, for a tier of several levels (else none).
    levels: tuple[LevelUsage, ...] = ()


class PoolReporting(Protocol):
    """What a pool tier may report (all optional; each asked for below)."""

    def probe(self, nbytes: int) -> None: ...

    def probe_store(self, nbytes: int) -> None: ...

    def stats(self) -> dict[str, Any]: ...

    def audit(self) -> dict[str, Any] | None: ...

    def usage(self) -> TierUsage: ...


class BackendReporting(Protocol):
    """What a backend may report (optional; asked for by :func:`describe`)."""

    def describe(self) -> dict[str, Any]: ...


def stats_of(tier: Any) -> dict[str, Any]:
    """``tier.stats()``, or ``{}`` for a tier that reports none."""
    stats = getattr(tier, "stats", None)
    return {} if stats is None else dict(stats())


def audit_of(tier: Any) -> dict[str, Any] | None:
    """``tier.audit()``: where its memory landed; None for a tier that places none."""
    audit = getattr(tier, "audit", None)
    return None if audit is None else audit()


def probe(tier: Any, nbytes: int) -> None:
    """``tier.probe(nbytes)``; an UnsupportedError for a tier that has no probe."""
    _probe(tier, "probe", nbytes, "its largest single move (implement PoolReporting.probe to "
           "give bench a limit)")  # fmt: skip


def probe_store(tier: Any, nbytes: int) -> None:
    """``tier.probe_store(nbytes)``; an UnsupportedError for a tier that has none."""
    _probe(tier, "probe_store", nbytes, "its largest single move into the tier (implement "
           "PoolReporting.probe_store to give bench a store limit)")  # fmt: skip


def _probe(tier: Any, name: str, nbytes: int, what: str) -> None:
    run = getattr(tier, name, None)
    if run is None:
        message = f"{type(tier).__name__} has no {name}(nbytes): its backend cannot measure {what}"
        raise UnsupportedError(message)
    run(nbytes)


def describe(backend: Any) -> dict[str, Any]:
    """``backend.describe()``, or its name and capabilities for a backend that has none."""
    report = getattr(backend, "describe", None)
    if report is not None:
        return dict(report())
    return {"name": backend.name, "capabilities": sorted(backend.capabilities)}
