"""PrefillCost: an engine's prefill seconds as a step's fixed cost, a cost a token and a cost
a token pair (attention), fitted over its steps.

A step that prefills ``t`` tokens takes about ``fixed + t / rate + quadratic * t**2``: each
token's projections and MLP cost the same, its attention grows with the tokens before it.
On a short prompt the linear part dominates, on a long one the quadratic: vLLM on 2 CPU
cores prefilled 421 tokens in 5.4 ms, 1,007 in 17.5 ms and 4,096 in 178 ms, where a line
fitted through the same steps (:class:`~.marginal.MarginalRate`, 34,000 tokens a second)
priced 416 tokens at 12 ms, three times their cost, and so the restore of a short prefix
(10 ms, the engine's own steps of waiting for it) as a saving. What computing a prefix of
``p`` tokens adds to its request is ``p / rate + quadratic * p**2`` (the suffix attends to
the prefix either way: ``(N**2 - p**2)`` of a prompt of ``N`` tokens is paid restored or
not).

Each ``add`` (one step, or a sum of ``steps`` of them, as a scheduler receives its workers'
steps, with the sum of its prompts' squared spans where the engine gives it, else each step
taken as one prompt) adds to decayed least-squares sums; the fit is O(1) a call. Where the
three terms cannot be told apart (fewer than :data:`MIN_SAMPLES` steps, lengths too alike:
:data:`MIN_SPREAD`) or the fit says a term is negative (noise, or an engine whose cost is
linear), the figures are the line's, as :class:`~.marginal.MarginalRate` gives them
(``quadratic`` 0). The clock is injected.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from .marginal import Fit, MarginalRate
from .rates import DecayingSums

__all__ = ["MIN_SAMPLES", "MIN_SPREAD", "PrefillCost", "PrefillFit"]

#: Steps before the three terms are fitted: three fit any parabola exactly, noise included.
MIN_SAMPLES = 4
#: The least relative determinant of the normal equations (their determinant over the
#: product of their diagonal) the three terms need: lengths spread less than that say
#: nothing of the curve, and the line is used.
MIN_SPREAD = 1e-4


@dataclass(frozen=True, slots=True)
class PrefillFit:
    """A :class:`PrefillCost`'s figures at one moment: ``line`` as :class:`~.marginal.Fit`
    (``rate`` tokens a second at the margin, ``fixed`` seconds a step, ``separated``,
    ``mean_call``, ``calls``), from the three-term fit where it holds, and ``quadratic``:
    seconds per token squared (0 where the line is used)."""

    line: Fit
    quadratic: float = 0.0

    def seconds(self, tokens: float) -> float:
        """What computing ``tokens`` more adds to a step: ``tokens / rate + quadratic *
        tokens**2`` (the fixed part is paid anyway)."""
        return tokens / self.line.rate + self.quadratic * tokens * tokens


class PrefillCost(DecayingSums):
    """An engine's prefill over its recent steps: fixed, linear and quadratic seconds;
    thread-safe. ``per_second`` is the fit's rate at the margin, as
    :class:`~.marginal.MarginalRate`'s."""

    def __init__(self, half_life_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        # Decayed sums of the normal equations over the columns c (steps), u (tokens) and
        # q (tokens squared, over the steps): cc, cu, cq, uu, uq, qq, cy, uy, qy; and u, y.
        super().__init__(11, half_life_s, clock)
        self._count = 0
        self._known: tuple[int, PrefillFit | None] | None = None

    def add(
        self, tokens: float, seconds: float, steps: int = 1, squares: float | None = None
    ) -> None:
        """``steps`` steps prefilled ``tokens`` in ``seconds`` together; ``squares``: the sum,
        over the prompts they prefilled, of what each prompt's attention spans (a prompt of
        ``t`` new tokens after ``c`` cached ones: ``(c + t)**2 - c**2``); None: each step one
        prompt of an equal share of the tokens. None of no time, no steps or negative tokens
        is ignored."""
        if not (seconds > 0 and tokens >= 0 and steps >= 1) or math.isinf(seconds + tokens):
            return
        c, u, y = float(steps), float(tokens), float(seconds)
        q = u * u / c if squares is None or not 0 <= squares < math.inf else float(squares)
        terms = (c * c, c * u, c * q, u * u, u * q, q * q, c * y, u * y, q * y, u, y)
        with self._lock:
            sums = self._aged()
            for i, term in enumerate(terms):
                sums[i] += term
            self._count += 1

    def figures(self) -> PrefillFit | None:
        """Everything known, read at one moment; None before a step."""
        with self._lock:
            known = self._known
            if known is not None and known[0] == self._count:
                return known[1]
            sums = tuple(self._sums)
            count = self._count
        figures = _solve(sums, count)
        with self._lock:
            if self._count == count:
                self._known = (count, figures)
        return figures

    def fit(self) -> tuple[float, float] | None:
        """``(tokens per second at the margin, fixed seconds a step)``, None before a step."""
        figures = self.figures()
        return None if figures is None else (figures.line.rate, figures.line.fixed)

    @property
    def per_second(self) -> float | None:
        """The marginal rate (the linear term's), None before the first step."""
        figures = self.figures()
        return None if figures is None else figures.line.rate


def _solve(sums: tuple[float, ...], count: int) -> PrefillFit | None:
    """The figures of one reading of the sums: the three terms where they hold, else the
    line (:meth:`.MarginalRate._solve` of the same sums)."""
    cc, cu, cq, uu, uq, qq, cy, uy, qy, u, y = sums
    line = MarginalRate._solve(cc, cu, uu, cy, uy, u, y, count)
    if line is None:
        return None
    if count < MIN_SAMPLES or not (cc > 0 and uu > 0 and qq > 0):
        return PrefillFit(line)
    # Cramer's rule on [[cc, cu, cq], [cu, uu, uq], [cq, uq, qq]] @ (fixed, slope, quadratic)
    # = (cy, uy, qy).
    det = cc * (uu * qq - uq * uq) - cu * (cu * qq - uq * cq) + cq * (cu * uq - uu * cq)
    if det <= MIN_SPREAD * cc * uu * qq:
        return PrefillFit(line)
    fixed = (cy * (uu * qq - uq * uq) - cu * (uy * qq - uq * qy) + cq * (uy * uq - uu * qy)) / det
    slope = (cc * (uy * qq - uq * qy) - cy * (cu * qq - uq * cq) + cq * (cu * qy - uy * cq)) / det
    quadratic = (
        cc * (uu * qy - uy * uq) - cu * (cu * qy - uy * cq) + cy * (cu * uq - uu * cq)
    ) / det
    if fixed < 0:  # noise: no fixed cost, the curve through the origin
        det2 = uu * qq - uq * uq
        if det2 <= MIN_SPREAD * uu * qq:
            return PrefillFit(line)
        fixed = 0.0
        slope = (uy * qq - uq * qy) / det2
        quadratic = (uu * qy - uq * uy) / det2
    if not (slope > 0 and quadratic > 0):  # a line, or noise: the line's figures
        return PrefillFit(line)
    return PrefillFit(Fit(1.0 / slope, fixed, True, line.mean_call, count), quadratic)
