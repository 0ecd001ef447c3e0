"""The command line's numbers: every one is bounded on both sides, every float is finite.

An integer option declares ``min`` and ``max`` (typer refuses what is outside with the
option's name); a float option is parsed by :class:`Finite`, which also refuses ``nan`` and
``inf`` (typer's own bounds let ``nan`` through with a message about the upper bound). The
bounds are the module's constants, each saying what it bounds; ``tests/cli/test_numbers.py``
walks every command and fails on an unbounded number.
"""

from __future__ import annotations

import math
from typing import Any

from ..values import shorten

__all__ = [
    "MAX_DIM",
    "MAX_HOLD_S",
    "MAX_RANKS",
    "MAX_REPEAT",
    "MAX_SEED",
    "MAX_TOKENS",
    "Finite",
    "RateOption",
]

#: Most tokens a command sizes or measures (2**40: a 1 PiB tier of 1 KiB tokens).
MAX_TOKENS = 1 << 40
#: Largest model dimension a plan takes (layers, KV heads, head dim, page size).
MAX_DIM = 1 << 20
#: Most ranks (--tp, --pp, --ranks-per-host, --ranks) or pools a command takes.
MAX_RANKS = 1 << 16
#: Most repeats per order of a measurement.
MAX_REPEAT = 1000
#: Longest ``bench --metrics-hold``.
MAX_HOLD_S = 7 * 86400.0
#: Largest sampler seed (numpy's and optuna's seeds are 32-bit).
MAX_SEED = (1 << 32) - 1


class Finite:
    """A float option's parser: a finite number from ``low`` to ``high`` (both included)."""

    def __init__(self, low: float, high: float, unit: str = "") -> None:
        self.low, self.high, self.unit = low, high, unit

    def __call__(self, text: Any) -> float:
        try:
            value = float(text)
        except (TypeError, ValueError):
            raise ValueError(f"expected a number, got {shorten(text)}") from None
        if not (math.isfinite(value) and self.low <= value <= self.high):
            unit = f" {self.unit}" if self.unit else ""
            message = (
                f"expected a finite number from {self.low:g} to {self.high:g}{unit}, "
                f"got {shorten(text)}"
            )
            raise ValueError(message)
        return value

    def __repr__(self) -> str:
        return f"Finite({self.low:g}, {self.high:g})"


class RateOption(Finite):
    """A rate option's parser: text with its unit (``50GB/s``, ``400Gbit/s``) -> GB/s, bounded.

    A bare number is refused (:mod:`kvcr_policy.config.rates` says why and lists the forms).
    """

    def __call__(self, text: Any) -> float:
        from ..config.rates import parse_gb_per_s

        gb_per_s = parse_gb_per_s(text)
        if not (math.isfinite(gb_per_s) and self.low <= gb_per_s <= self.high):
            message = (
                f"expected a rate from {self.low:g}GB/s to {self.high:g}GB/s, "
                f"got {shorten(text)} = {gb_per_s:g}GB/s"
            )
            raise ValueError(message)
        return gb_per_s

    def __repr__(self) -> str:
        return f"RateOption({self.low:g}, {self.high:g})"
