"""DecayedRate: a rate (units per second) over recent calls, older calls weighing less.

Each call adds its units and seconds to two sums that decay by half every ``half_life_s`` of
the clock; the rate is their ratio, so a burst of slow calls moves it within a few half-lives
and a long call weighs by its length, not as one sample. The clock is injected (tests pass
their own); the default is :func:`time.monotonic`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

__all__ = ["DecayedRate"]


class DecayedRate:
    """Units per second over recent calls; thread-safe."""

    def __init__(self, half_life_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be positive, got {half_life_s!r}")
        self._decay = math.log(2) / half_life_s
        self._clock = clock
        self._lock = threading.Lock()
        self._units = 0.0
        self._seconds = 0.0
        self._at: float | None = None  # when the sums were last decayed

    def add(self, units: float, seconds: float) -> None:
        """One call moved ``units`` in ``seconds``; a call of no time is ignored."""
        if seconds <= 0 or units < 0:
            return
        with self._lock:
            self._age(self._clock())
            self._units += units
            self._seconds += seconds

    def _age(self, now: float) -> None:
        if self._at is not None and now > self._at:
            keep = math.exp(-self._decay * (now - self._at))
            self._units *= keep
            self._seconds *= keep
        self._at = now if self._at is None else max(now, self._at)

    @property
    def per_second(self) -> float | None:
        """The decayed rate, None before the first call."""
        with self._lock:
            return self._units / self._seconds if self._seconds > 0 else None

    @property
    def idle_s(self) -> float | None:
        """Seconds since the last call was added, None before the first."""
        with self._lock:
            return None if self._at is None else max(0.0, self._clock() - self._at)
