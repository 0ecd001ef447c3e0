"""DecayedRate: a rate (units per second) over recent calls, older calls weighing less.

Each call adds its units and seconds to two sums that decay by half every ``half_life_s`` of
the clock; the rate is their ratio, so a burst of slow calls moves it within a few half-lives
and a long call weighs by its length, not as one sample. The clock is injected (tests pass
their own); the default is :func:`time.monotonic`. The decay itself is
:class:`DecayingSums`, which :class:`~.marginal.MarginalRate` shares.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = ["DecayedRate", "DecayingSums"]


class DecayingSums:
    """Sums that decay by half every ``half_life_s`` of an injected clock; thread-safe.

    The one decay both rates share (:class:`DecayedRate` and
    :class:`~.marginal.MarginalRate`): a subclass adds its terms under ``self._lock`` after
    :meth:`_aged`, and reads ``self._sums`` under the same lock.
    """

    def __init__(
        self, count: int, half_life_s: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be positive, got {half_life_s!r}")
        self._decay = math.log(2) / half_life_s
        self._clock = clock
        self._lock = threading.Lock()
        self._sums = [0.0] * count
        self._at: float | None = None  # when the sums were last decayed

    def _aged(self) -> list[float]:
        """The sums decayed to now (the caller holds ``self._lock``), to add terms to."""
        now = self._clock()
        if self._at is not None and now > self._at:
            keep = math.exp(-self._decay * (now - self._at))
            self._sums = [s * keep for s in self._sums]
        self._at = now if self._at is None else max(now, self._at)
        return self._sums

    @property
    def idle_s(self) -> float | None:
        """Seconds since the last call was added, None before the first."""
        with self._lock:
            return None if self._at is None else max(0.0, self._clock() - self._at)


class DecayedRate(DecayingSums):
    """Units per second over recent calls; thread-safe."""

    def __init__(self, half_life_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        super().__init__(2, half_life_s, clock)  # units, seconds

    def add(self, units: float, seconds: float) -> None:
        """One call moved ``units`` in ``seconds``; a call of no time is ignored."""
        if seconds <= 0 or units < 0:
            return
        with self._lock:
            sums = self._aged()
            sums[0] += units
            sums[1] += seconds

    @property
    def per_second(self) -> float | None:
        """The decayed rate, None before the first call."""
        with self._lock:
            units, seconds = self._sums
            return units / seconds if seconds > 0 else None
