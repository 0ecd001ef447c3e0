"""MarginalRate: the units per second a call adds at the margin, its fixed cost fitted apart.

A call of ``units`` takes ``seconds = fixed + units / rate``: an engine's step (or prefill)
pays its scheduling, launch and sampling whatever its length, so a step's ``units / seconds``
understates the rate at which a longer prompt costs more, the more so the shorter the step.
Each call (or a sum of ``calls`` of them, as a scheduler of its own receives its workers'
steps) adds to decayed least-squares sums of ``seconds = fixed * calls + units / rate``; the
solution, O(1) a call and a question, gives the marginal rate and the fixed seconds.

While the calls cannot tell the two apart (fewer than :data:`MIN_SAMPLES` samples, or their
lengths too alike: :data:`MIN_SPREAD`), or the fit says a unit costs nothing (noise), the rate
is the ratio of the decayed sums, as :class:`~.rates.DecayedRate` gives (the fixed cost counted
in, the upstream reading). A fitted fixed cost below zero (noise) is taken as none: the rate is then
the least-squares line through the origin. The clock is injected (tests pass their own).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from .rates import DecayingSums

__all__ = ["MIN_SAMPLES", "MIN_SPREAD", "Fit", "MarginalRate"]

#: Samples (``add`` calls) before a fit is trusted: two fit any line exactly, noise included.
MIN_SAMPLES = 3
#: The least ``1 - cos^2`` of the angle between the calls and units columns (the relative
#: determinant of the normal equations) a fit needs: lengths whose spread is below about
#: 15 % of their mean cannot separate a fixed cost from a rate.
MIN_SPREAD = 0.02


@dataclass(frozen=True, slots=True)
class Fit:
    """A :class:`MarginalRate`'s figures at one moment. ``rate``: units per second at the
    margin (the ratio of the sums while ``separated`` is False); ``fixed``: seconds a call
    (0 while not separated); ``mean_call``: ``(units, seconds)`` of the mean call (decayed),
    whose seconds beyond its units at a rate known otherwise are a call's fixed part;
    ``calls``: ``add`` calls counted (not decayed)."""

    rate: float
    fixed: float
    separated: bool
    mean_call: tuple[float, float] | None
    calls: int


class MarginalRate(DecayingSums):
    """Units per second at the margin over recent calls, and their fixed seconds;
    thread-safe. ``per_second`` and ``idle_s`` read as :class:`~.rates.DecayedRate`'s."""

    def __init__(self, half_life_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        # Decayed sums: calls^2, calls*units, units^2, calls*seconds, units*seconds, units,
        # seconds.
        super().__init__(7, half_life_s, clock)
        self._count = 0
        #: The figures of the sums as of ``_count`` calls: they change only when a call is
        #: added (the decay scales every sum alike, so the fit and the ratios hold between
        #: calls), and a gate reads them at every lookup.
        self._known: tuple[int, Fit | None] | None = None

    def add(self, units: float, seconds: float, calls: int = 1) -> None:
        """``calls`` calls moved ``units`` in ``seconds`` together; none of no time, units or
        calls is ignored."""
        if not (seconds > 0 and units >= 0 and calls >= 1) or math.isinf(seconds + units):
            return
        c, u, y = float(calls), float(units), float(seconds)
        with self._lock:
            sums = self._aged()
            for i, term in enumerate((c * c, c * u, u * u, c * y, u * y, u, y)):
                sums[i] += term
            self._count += 1

    def fit(self) -> tuple[float, float] | None:
        """``(units per second at the margin, fixed seconds a call)``, None before a call."""
        figures = self.figures()
        return None if figures is None else (figures.rate, figures.fixed)

    def figures(self) -> Fit | None:
        """Everything known, read at one moment (None before a call): the fit, whether it
        told the fixed seconds apart, the mean call and how many calls it rests on."""
        with self._lock:
            known = self._known
            if known is not None and known[0] == self._count:
                return known[1]
            cc, cu, uu, cy, uy, u, y = self._sums
            count = self._count
        figures = self._solve(cc, cu, uu, cy, uy, u, y, count)
        with self._lock:
            if self._count == count:
                self._known = (count, figures)
        return figures

    @staticmethod
    def _solve(
        cc: float, cu: float, uu: float, cy: float, uy: float, u: float, y: float, count: int
    ) -> Fit | None:
        """The figures of one reading of the sums (see :meth:`figures`)."""
        if y <= 0:
            return None
        mean = (cu / cc, cy / cc) if cc > 0 and cy > 0 else None
        ratio = Fit(u / y, 0.0, False, mean, count)
        det = cc * uu - cu * cu
        if count < MIN_SAMPLES or uu <= 0 or det <= MIN_SPREAD * cc * uu:
            return ratio
        fixed = (uu * cy - cu * uy) / det
        slope = (cc * uy - cu * cy) / det
        if fixed < 0:  # noise: no fixed cost, the line through the origin
            fixed, slope = 0.0, uy / uu
        return Fit(1.0 / slope, fixed, True, mean, count) if slope > 0 else ratio

    @property
    def per_second(self) -> float | None:
        """The marginal rate (the ratio while no fit holds), None before the first call."""
        fitted = self.fit()
        return None if fitted is None else fitted[0]
