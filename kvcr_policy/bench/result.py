"""The result of one benchmark run: its runs, the figures derived from them, and their JSON.

Every derived figure is a median over the runs of one run of the benchmark, and every ratio
is a median of ratios taken in the same moment: a restore over a limit measured right before
it, P over the baseline's run of the same repeat and order.

**The ratio to a limit** has one definition, computed here only (:func:`ratio_to`) and read
by everything that shows one (the JSON, the verdict line, ``tune``): the median, over a side's
restores, of each restore's rate over the limit measured right before that restore. It is not
the median rate over the median limit: where memory bandwidth drifts within a run, those two
medians come from different moments (a verdict that divided them once read 0.82 beside a
median of ratios of 1.126). Two limits stand beside each restore: the backend's own (its
largest single move of the same bytes, ``ratio_to_limit``) and this host's memory copy of the
same bytes (:mod:`.host_copy`, ``ratio_to_host_copy_limit``).

:meth:`BenchResult.to_dict` renders the keys of ``kvcr-policy bench --format json``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["BenchResult", "Limit", "Run", "Screen", "ratio_to", "setup_axes"]

#: The two limits a restore is measured beside.
Limit = Literal["limit", "host_copy"]


@dataclass(frozen=True, slots=True)
class Run:
    """One restore: which side, in which order and repeat, its rate and the two limits
    measured right before it (the backend's own, and this host's memory copy)."""

    repeat: int
    order: str
    profile: str
    side: str
    restore_gbps: float
    limit_gbps: float
    verified: bool
    host_copy_gbps: float

    @property
    def ratio_to_limit(self) -> float:
        return self.restore_gbps / self.limit_gbps

    @property
    def ratio_to_host_copy_limit(self) -> float:
        return self.restore_gbps / self.host_copy_gbps

    def to_dict(self) -> dict[str, Any]:
        return {
            "repeat": self.repeat,
            "order": self.order,
            "profile": self.profile,
            "side": self.side,
            "restore_gigabytes_per_s": self.restore_gbps,
            "limit_gigabytes_per_s": self.limit_gbps,
            "ratio_to_limit": self.ratio_to_limit,
            "host_copy_limit_gigabytes_per_s": self.host_copy_gbps,
            "ratio_to_host_copy_limit": self.ratio_to_host_copy_limit,
            "verified": self.verified,
        }


@dataclass(frozen=True, slots=True)
class Screen:
    """The regression screen: the orders in which P's median fell more than ``percent``
    below the baseline's."""

    percent: float
    failed_orders: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failed_orders

    def to_dict(self) -> dict[str, Any]:
        return {
            "percent": self.percent,
            "passed": self.passed,
            "failed_orders": list(self.failed_orders),
        }


def _median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def _r(value: float) -> float:
    return round(value, 3)


def _maybe(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def ratio_to(runs: Iterable[Run], limit: Limit) -> float:
    """THE ratio to a limit (the module docstring): the median of ``restore / limit`` over
    ``runs``, each restore against the ``limit`` measured right before it (``"limit"``: the
    backend's own; ``"host_copy"``: this host's memory copy)."""
    if limit == "limit":
        return _median(run.ratio_to_limit for run in runs)
    return _median(run.ratio_to_host_copy_limit for run in runs)


def setup_axes(setup: Any) -> dict[str, Any]:
    """The :class:`BenchResult` fields a run takes from its setup (a ``BenchSetup``): the
    geometry, layout, MLA, tokens, slot order and repeats."""
    names = ("geometry", "layout", "mla", "tokens", "scatter", "repeat")
    return {name: getattr(setup, name) for name in names}


@dataclass(frozen=True)
class BenchResult:
    """Everything one run measured; figures are derived here, once, for every target,
    backend and comparison.

    ``baseline`` is the label of the side P is compared with: ``"Q"`` (a profile) or
    ``"peer"`` (a peer implementation, which adds the ``peer_*`` keys). Mappings are keyed
    by side label; ``extra`` holds the keys a target, backend or comparison adds
    (``device``, ``peer``, ``tls``, ...).
    """

    target: str
    backend: str
    geometry: str
    layout: str
    mla: bool
    tokens: int
    pages: int
    page_bytes: int
    nbytes: int
    scatter: bool
    repeat: int
    baseline: str
    runs: tuple[Run, ...]
    limit: str
    profiles: Mapping[str, Mapping[str, str | None]]
    #: Side label -> its stores' median rate (into its emptied tier, ``repeat`` times in both
    #: orders; a side that cannot be emptied: its first store).
    store_gbps: Mapping[str, float]
    #: Side label -> this host's memory copy of the same bytes, measured right before each of
    #: its stores (median).
    store_host_copy_gbps: Mapping[str, float]
    #: The backend's limit in a few words, for the verdict line (``limit`` says it in full).
    limit_short: str = "one move of the same bytes"
    #: What this host's memory-copy limit is, in words.
    host_copy_limit: str = "one copy of the same bytes in host memory"
    exists_keys_per_s: Mapping[str, float] = field(default_factory=dict)
    descriptors: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    transport: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: Side label -> how many stores its figures are the median of (0: its first store only).
    stores_timed: Mapping[str, int] = field(default_factory=dict)
    #: ``"P"`` -> the store's limit, P's move of the same bytes into its emptied tier,
    #: measured right before each of P's stores (median), where the backend has one
    #: (``Pipeline.probe_store``); one limit for both sides, as a restore's is P's.
    store_limit_gbps: Mapping[str, float] = field(default_factory=dict)
    #: Side label -> its stores over that limit: P's the median of each store over the limit
    #: right before it, the baseline's its median store over P's median limit.
    store_ratio: Mapping[str, float] = field(default_factory=dict)
    #: What the store's limit is, in words.
    store_limit: str = "one move of the same bytes, pool -> emptied tier (Pipeline.probe_store)"

    # ---- figures ------------------------------------------------------------------------

    def _side(self, label: str, order: str | None = None) -> list[Run]:
        runs = [r for r in self.runs if r.side == label and order in (None, r.order)]
        if not runs:
            raise ValueError(f"no run of side {label!r}" + (f" in order {order}" if order else ""))
        return runs

    @property
    def verified(self) -> bool:
        """Every restore of every run arrived whole and matched the stored pages."""
        return bool(self.runs) and all(r.verified for r in self.runs)

    @property
    def orders(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.order for r in self.runs))

    @property
    def limit_gbps(self) -> float:
        return _median(r.limit_gbps for r in self.runs)

    def restore_gbps(self, label: str = "P", order: str | None = None) -> float:
        return _median(r.restore_gbps for r in self._side(label, order))

    def ratio_to_limit(self, label: str = "P", order: str | None = None) -> float:
        """:func:`ratio_to` the backend's limit, of side ``label`` (in ``order``, or both)."""
        return ratio_to(self._side(label, order), "limit")

    @property
    def host_copy_limit_gbps(self) -> float:
        return _median(r.host_copy_gbps for r in self.runs)

    def ratio_to_host_copy_limit(self, label: str = "P", order: str | None = None) -> float:
        """:func:`ratio_to` this host's memory copy, of side ``label`` (in ``order``, or both)."""
        return ratio_to(self._side(label, order), "host_copy")

    def store_ratio_to_host_copy_limit(self, label: str = "P") -> float:
        """Side ``label``'s median store over the median host copy measured before them."""
        return self.store_gbps[label] / self.store_host_copy_gbps[label]

    @property
    def speedup_vs_baseline(self) -> float:
        """The median over (repeat, order) of P's rate over the baseline's in that moment."""
        theirs = {(r.repeat, r.order): r.restore_gbps for r in self._side(self.baseline)}
        return _median(r.restore_gbps / theirs[(r.repeat, r.order)] for r in self._side("P"))

    def screen(self, percent: float) -> Screen:
        """Which orders have P's median more than ``percent`` % below the baseline's."""
        failed = tuple(
            order
            for order in self.orders
            if self.restore_gbps("P", order)
            < self.restore_gbps(self.baseline, order) * (1 - percent / 100)
        )
        return Screen(percent, failed)

    # ---- JSON ---------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``kvcr-policy bench``: medians rounded to 3 decimals, runs as taken."""
        base = self.baseline
        store, base_store = self.store_gbps["P"], self.store_gbps[base]
        data: dict[str, Any] = {
            "target": self.target,
            "backend": self.backend,
            "geometry": self.geometry,
            "layout": self.layout,
            "mla": self.mla,
            "tokens": self.tokens,
            "pages": self.pages,
            "page_bytes": self.page_bytes,
            "bytes": self.nbytes,
            "scatter": self.scatter,
            "repeat": self.repeat,
            "verified": self.verified,
            "limit": self.limit,
            "limit_short": self.limit_short,
            "limit_gigabytes_per_s": _r(self.limit_gbps),
            "host_copy_limit": self.host_copy_limit,
            "host_copy_limit_gigabytes_per_s": _r(self.host_copy_limit_gbps),
            "restore_gigabytes_per_s": _r(self.restore_gbps("P")),
            "baseline_gigabytes_per_s": _r(self.restore_gbps(base)),
            "ratio_to_limit": _r(self.ratio_to_limit("P")),
            "baseline_ratio_to_limit": _r(self.ratio_to_limit(base)),
            "ratio_to_host_copy_limit": _r(self.ratio_to_host_copy_limit("P")),
            "baseline_ratio_to_host_copy_limit": _r(self.ratio_to_host_copy_limit(base)),
            "speedup_vs_baseline": _r(self.speedup_vs_baseline),
            "store_gigabytes_per_s": _r(store),
            "baseline_store_gigabytes_per_s": _r(base_store),
            "store_host_copy_limit_gigabytes_per_s": _r(self.store_host_copy_gbps["P"]),
            "store_ratio_to_host_copy_limit": _r(self.store_ratio_to_host_copy_limit("P")),
            "baseline_store_ratio_to_host_copy_limit": _r(
                self.store_ratio_to_host_copy_limit(base)
            ),
            "stores_timed": dict(self.stores_timed),
            "store_limit": self.store_limit if self.store_limit_gbps else None,
            "store_limit_gigabytes_per_s": _maybe(self.store_limit_gbps.get("P")),
            "store_ratio_to_limit": _maybe(self.store_ratio.get("P")),
            "baseline_store_ratio_to_limit": _maybe(self.store_ratio.get(base)),
        }
        if base == "peer":
            data.update(
                peer_gigabytes_per_s=data["baseline_gigabytes_per_s"],
                speedup_vs_peer=data["speedup_vs_baseline"],
                peer_store_gigabytes_per_s=data["baseline_store_gigabytes_per_s"],
                store_speedup_vs_peer=_r(store / base_store),
            )
        # One measure of metadata lookups: keys per second of exists over stored keys (once
        # also printed as query_keys_per_s, the same number twice).
        if "P" in self.exists_keys_per_s:
            data["exists_keys_per_s"] = round(self.exists_keys_per_s["P"])
        if base in self.exists_keys_per_s:
            data["baseline_exists_keys_per_s"] = round(self.exists_keys_per_s[base])
        data["orders"] = {
            order: {
                "restore_gigabytes_per_s": _r(self.restore_gbps("P", order)),
                "baseline_gigabytes_per_s": _r(self.restore_gbps(base, order)),
                "ratio_to_limit": _r(self.ratio_to_limit("P", order)),
                "baseline_ratio_to_limit": _r(self.ratio_to_limit(base, order)),
                "ratio_to_host_copy_limit": _r(self.ratio_to_host_copy_limit("P", order)),
                "baseline_ratio_to_host_copy_limit": _r(self.ratio_to_host_copy_limit(base, order)),
            }
            for order in self.orders
        }
        data["profiles"] = {label: dict(p) for label, p in self.profiles.items()}
        data["descriptors"] = {label: dict(d) for label, d in self.descriptors.items()}
        data["transport"] = dict(self.transport)
        data.update(self.extra)
        data["runs"] = [r.to_dict() for r in self.runs]
        return data
