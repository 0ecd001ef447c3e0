"""MarginalRate on an injected clock and injected step timings (never this machine's speed):
seconds = fixed * calls + units / rate, fitted by decayed least squares; the ratio of the sums
while no fit holds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.observability.marginal import MIN_SAMPLES, MarginalRate


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def steps(rate: MarginalRate, clock: Clock, lengths: list[int], fixed: float, tps: float) -> None:
    for tokens in lengths:
        rate.add(tokens, fixed + tokens / tps)
        clock.now += 0.5


def test_a_steps_fixed_cost_is_fitted_apart_from_its_rate() -> None:
    # 20 ms a step whatever its length, then 10,000 tokens/s: a 64-token step runs at
    # 64 / 0.0264 = 2,424 tokens/s, which the ratio of the sums understates further still.
    clock = Clock()
    rate = MarginalRate(10.0, clock)
    steps(rate, clock, [64, 512, 32, 1024, 96, 256], 0.020, 10_000)
    fitted = rate.fit()
    assert fitted is not None
    assert fitted[0] == pytest.approx(10_000, rel=1e-9)
    assert fitted[1] == pytest.approx(0.020, rel=1e-9)
    assert rate.per_second == pytest.approx(10_000, rel=1e-9)


def test_summed_steps_fit_as_the_steps_would() -> None:
    # A scheduler of its own receives its workers' steps summed: 3 steps of 100 tokens.
    clock = Clock()
    rate = MarginalRate(10.0, clock)
    for calls, tokens in [(3, 300), (1, 800), (2, 50), (1, 20)]:
        rate.add(tokens, calls * 0.005 + tokens / 40_000, calls)
        clock.now += 1
    assert rate.fit() == pytest.approx((40_000, 0.005), rel=1e-9)


def test_alike_lengths_or_few_samples_give_the_ratio() -> None:
    clock = Clock()
    rate = MarginalRate(10.0, clock)
    assert rate.fit() is None and rate.per_second is None and rate.idle_s is None
    rate.add(100, 0.03)
    rate.add(300, 0.05)  # two samples fit any line: not trusted yet
    assert MIN_SAMPLES == 3
    assert rate.fit() == pytest.approx((400 / 0.08, 0.0))
    same = MarginalRate(10.0, clock)
    for _ in range(10):  # one length only: fixed and rate cannot be told apart
        same.add(128, 0.0228)
    assert same.fit() == pytest.approx((128 / 0.0228, 0.0))
    clock.now += 2
    assert same.idle_s == 2.0


def test_noise_never_gives_a_negative_fixed_cost_or_a_free_token() -> None:
    clock = Clock()
    negative = MarginalRate(10.0, clock)  # longer steps cheaper than a line through 0
    for tokens, seconds in [(10, 0.0001), (100, 0.011), (200, 0.021)]:
        negative.add(tokens, seconds)
    fitted = negative.fit()
    assert fitted is not None and fitted[1] == 0.0
    assert fitted[0] == pytest.approx(
        (10**2 + 100**2 + 200**2) / (10 * 0.0001 + 100 * 0.011 + 200 * 0.021)
    )
    flat = MarginalRate(10.0, clock)  # longer steps no slower: a token would cost nothing
    for tokens, seconds in [(10, 0.02), (100, 0.02), (1000, 0.019)]:
        flat.add(tokens, seconds)
    assert flat.fit() == pytest.approx((1110 / 0.059, 0.0))  # the ratio, never infinite


def test_older_steps_fade_and_bad_samples_are_ignored() -> None:
    clock = Clock()
    rate = MarginalRate(1.0, clock)
    steps(rate, clock, [64, 512, 32, 1024], 0.020, 1_000)
    clock.now += 200  # 200 half-lives: the engine changed (another tenant, a bigger batch)
    steps(rate, clock, [64, 512, 32, 1024], 0.001, 50_000)
    assert rate.fit() == pytest.approx((50_000, 0.001), rel=1e-6)
    for units, seconds, calls in [(10, 0.0, 1), (-1, 1.0, 1), (10, 1.0, 0), (1, float("inf"), 1)]:
        rate.add(units, seconds, calls)
    assert rate.fit() == pytest.approx((50_000, 0.001), rel=1e-6)
    with pytest.raises(ValueError, match="half_life_s"):
        MarginalRate(0.0)


@given(
    fixed=st.floats(0.0, 0.1),
    tps=st.floats(100.0, 1e6),
    lengths=st.lists(st.integers(1, 8192), min_size=3, max_size=30, unique=True),
)
def test_exact_steps_give_back_their_rate_and_fixed_cost(
    fixed: float, tps: float, lengths: list[int]
) -> None:
    clock = Clock()
    rate = MarginalRate(10.0, clock)
    steps(rate, clock, lengths, fixed, tps)
    fitted = rate.fit()
    assert fitted is not None
    mean = sum(lengths) / len(lengths)
    spread = sum((n - mean) ** 2 for n in lengths) / sum(n * n for n in lengths)
    if spread > 0.05:  # lengths that tell the two apart (the weights differ a little)
        assert fitted[0] == pytest.approx(tps, rel=1e-6)
        assert fitted[1] == pytest.approx(fixed, rel=1e-6, abs=1e-12)
    # Whatever the lengths: never slower than the slowest step's tokens over its seconds
    # (the ratio of the decayed sums is at least that), never faster than the true rate.
    slowest = min(n / (fixed + n / tps) for n in lengths)
    assert slowest * (1 - 1e-9) <= fitted[0] <= tps * (1 + 1e-9)


@given(
    st.lists(
        st.tuples(
            st.integers(0, 100_000),
            st.floats(1e-4, 10.0),
            st.integers(1, 4),
            st.floats(0.0, 30.0),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_figures_read_between_calls_are_those_of_the_sums_at_that_moment(
    calls: list[tuple[int, float, int, float]],
) -> None:
    # The figures are kept from one reading to the next until a call is added: each reading,
    # however long after the last call, equals what a rate fed the same calls at the same
    # moments computes afresh (the decay scales every sum alike, so the fit holds between
    # calls), and an added call is seen by the next reading.
    clock, fresh_clock = Clock(), Clock()
    rate = MarginalRate(5.0, clock)
    for n, (units, seconds, count, wait) in enumerate(calls):
        rate.add(units, seconds, count)
        kept = rate.figures()
        clock.now += wait
        fresh_clock.now = clock.now
        fresh = MarginalRate(5.0, fresh_clock)
        fresh_clock.now -= sum(c[3] for c in calls[: n + 1])
        for u, s, c, w in calls[: n + 1]:
            fresh.add(u, s, c)
            fresh_clock.now += w
        later, again = rate.figures(), fresh.figures()
        assert later is kept
        assert later is not None and again is not None
        assert later.calls == again.calls == n + 1
        assert later.separated == again.separated
        assert later.rate == pytest.approx(again.rate, rel=1e-6)
        assert later.fixed == pytest.approx(again.fixed, rel=1e-6, abs=1e-9)
