"""No win without evidence: the rule a tuned profile must pass before it is written.

A confirmation is one bench comparison of the candidate (P) against its starting profile (Q),
``repeat`` restores per side in both orders (P then Q, Q then P), every restored byte verified.
The candidate wins only if, in **each** order:

- the bench's regression screen passes (P's median no more than ``screen_pct`` % below Q's);
- its median gain, the median over repeats of P's rate over Q's taken in the same moment,
  minus one, is positive and larger than the spread of those gains (their interquartile
  range): a gain the repeats' own scatter could produce is no evidence.

Fewer than three repeats per order is no evidence either.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ..bench import BenchResult, Screen

__all__ = ["MIN_REPEATS", "ORDER_NAMES", "OrderFigures", "Verdict", "judge"]

MIN_REPEATS = 3
#: The bench's orders as a tuned profile's evidence names them (P: tuned, Q: its base).
ORDER_NAMES = {"P,Q": "tuned, then base", "Q,P": "base, then tuned"}


def _pct(value: float) -> str:
    return f"{value * 100:+.1f} %"


@dataclass(frozen=True, slots=True)
class OrderFigures:
    """One order's figures: the start (before) and the candidate (after), medians."""

    order: str
    before_gbps: float
    after_gbps: float
    before_ratio: float
    after_ratio: float
    #: Median of P/Q - 1 over the repeats, each pair taken in the same moment.
    gain: float
    #: Interquartile range of those per-repeat gains.
    spread: float
    repeats: int

    @property
    def wins(self) -> bool:
        return self.repeats >= MIN_REPEATS and self.gain > 0 and self.gain > self.spread

    @property
    def name(self) -> str:
        return ORDER_NAMES.get(self.order, self.order)

    def describe(self) -> str:
        """One statistic, stated as such: the median of tuned/base rates taken in the same
        moment. (The medians of each side's rates, in the JSON, come from different moments
        and can point the other way on a noisy host.)"""
        return (
            f"order {self.name}: tuned/base {1 + self.gain:.3f} = {_pct(self.gain)}, "
            f"median of {self.repeats} pairs taken in the same moment "
            f"(spread {self.spread * 100:.1f} %)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "before_gigabytes_per_s": round(self.before_gbps, 3),
            "after_gigabytes_per_s": round(self.after_gbps, 3),
            "before_ratio_to_limit": round(self.before_ratio, 3),
            "after_ratio_to_limit": round(self.after_ratio, 3),
            "gain": round(self.gain, 4),
            "spread": round(self.spread, 4),
            "repeats": self.repeats,
            "wins": self.wins,
        }


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a confirmation is evidence of a win, and if not, why."""

    orders: tuple[OrderFigures, ...]
    screen: Screen
    verified: bool

    @property
    def gain(self) -> float:
        """The smallest median gain over the orders: what the candidate surely brings."""
        return min(o.gain for o in self.orders)

    @property
    def wins(self) -> bool:
        return (
            self.verified
            and self.screen.passed
            and len(self.orders) == 2
            and all(o.wins for o in self.orders)
        )

    def reasons(self) -> list[str]:
        """Why the candidate does not win; empty when it does."""
        found = []
        if not self.verified:
            found.append("restored bytes did not match what was stored")
        for order in self.screen.failed_orders:
            name = ORDER_NAMES.get(order, order)
            found.append(f"order {name}: more than {self.screen.percent:g} % below the start")
        for o in self.orders:
            if o.repeats < MIN_REPEATS:
                found.append(f"order {o.name}: {o.repeats} repeats, fewer than {MIN_REPEATS}")
            elif o.gain <= 0:
                found.append(f"order {o.name}: no gain ({_pct(o.gain)})")
            elif o.gain <= o.spread:
                found.append(
                    f"order {o.name}: gain {_pct(o.gain)} within the spread of the repeats "
                    f"({o.spread * 100:.1f} %)"
                )
        return found

    def to_dict(self) -> dict[str, Any]:
        return {
            "wins": self.wins,
            "verified": self.verified,
            "screen": self.screen.to_dict(),
            "orders": {o.order: o.to_dict() for o in self.orders},
            "reasons": self.reasons(),
        }


def _spread(gains: list[float]) -> float:
    if len(gains) < 2:
        return float("inf")
    q1, _, q3 = statistics.quantiles(gains, n=4, method="inclusive")
    return q3 - q1


def judge(result: BenchResult, screen_pct: float = 5.0) -> Verdict:
    """The verdict on one confirmation run (P: the candidate, the baseline: the start)."""
    base = result.baseline
    orders = []
    for order in result.orders:
        mine = [r for r in result.runs if r.side == "P" and r.order == order]
        theirs = {r.repeat: r for r in result.runs if r.side == base and r.order == order}
        gains = [r.restore_gbps / theirs[r.repeat].restore_gbps - 1 for r in mine]
        orders.append(
            OrderFigures(
                order=order,
                before_gbps=result.restore_gbps(base, order),
                after_gbps=result.restore_gbps("P", order),
                before_ratio=result.ratio_to_limit(base, order),
                after_ratio=result.ratio_to_limit("P", order),
                gain=statistics.median(gains),
                spread=_spread(gains),
                repeats=len(gains),
            )
        )
    return Verdict(tuple(orders), result.screen(screen_pct), result.verified)
