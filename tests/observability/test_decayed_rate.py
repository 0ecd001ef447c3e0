"""DecayedRate on an injected clock: the ratio of decayed sums, halving every half-life."""

from __future__ import annotations

import math

import pytest

from kvcr_policy.observability.rates import DecayedRate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_rate_before_the_first_call_and_one_calls_rate_after_it() -> None:
    clock = Clock()
    rate = DecayedRate(10.0, clock)
    assert rate.per_second is None and rate.idle_s is None
    rate.add(1000, 2.0)
    assert rate.per_second == 500.0
    clock.now += 3
    assert rate.idle_s == 3.0


def test_older_calls_weigh_half_after_each_half_life() -> None:
    clock = Clock()
    rate = DecayedRate(10.0, clock)
    rate.add(100, 1.0)  # 100/s
    clock.now += 10.0  # one half-life: it now counts as 50 units in 0.5 s
    rate.add(1000, 1.0)  # 1000/s
    assert rate.per_second == pytest.approx((50 + 1000) / (0.5 + 1.0))
    clock.now += 1000.0
    rate.add(10, 1.0)  # the old calls have all but vanished
    assert math.isclose(rate.per_second or 0, 10.0, rel_tol=1e-6)


def test_calls_of_no_time_are_ignored_and_a_bad_half_life_is_refused() -> None:
    rate = DecayedRate(1.0, Clock())
    rate.add(5, 0.0)
    assert rate.per_second is None
    with pytest.raises(ValueError, match="half_life_s"):
        DecayedRate(0.0)
