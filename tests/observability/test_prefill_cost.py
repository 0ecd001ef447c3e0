"""PrefillCost on an injected clock and injected step timings (never this machine's speed):
seconds = fixed * steps + tokens / rate + quadratic * squares, fitted by decayed least
squares; the line's figures (MarginalRate's) wherever the three terms do not hold."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.observability.marginal import MarginalRate
from kvcr_policy.observability.prefill_cost import MIN_SAMPLES, PrefillCost

#: vLLM's prefill on 2 CPU cores, fitted over one replay's steps: 2.3 ms a step, 163,000
#: tokens a second, 8.8e-9 seconds a token pair (421 tokens 5.4 ms, 4,096 tokens 178 ms).
FIXED, RATE, QUADRATIC = 0.0023, 163_000.0, 8.8e-9


def cost(tokens: float, cached: float = 0.0) -> float:
    span = (cached + tokens) ** 2 - cached**2
    return FIXED + tokens / RATE + QUADRATIC * span


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_attention_term_is_fitted_apart_from_the_rate_and_the_fixed_cost() -> None:
    clock = Clock()
    prefill = PrefillCost(10.0, clock)
    line = MarginalRate(10.0, clock)
    for tokens in (421, 1007, 195, 4096, 96, 2839, 626, 1616):
        prefill.add(tokens, cost(tokens))
        line.add(tokens, cost(tokens))
        clock.now += 0.5
    figures = prefill.figures()
    assert figures is not None and figures.line.separated
    assert figures.line.rate == pytest.approx(RATE, rel=1e-6)
    assert figures.line.fixed == pytest.approx(FIXED, rel=1e-6)
    assert figures.quadratic == pytest.approx(QUADRATIC, rel=1e-6)
    assert prefill.per_second == pytest.approx(RATE, rel=1e-6)
    assert prefill.fit() == pytest.approx((RATE, FIXED), rel=1e-6)
    # What computing a prefix adds: 416 tokens 4.1 ms, where the line prices them at 3x.
    assert figures.seconds(416) == pytest.approx(416 / RATE + QUADRATIC * 416**2)
    line_rate = line.per_second
    assert line_rate is not None and 416 / line_rate > 2.5 * figures.seconds(416)


def test_a_prompt_after_cached_tokens_and_summed_steps_fit_as_the_steps_would() -> None:
    clock = Clock()
    prefill = PrefillCost(10.0, clock)
    # (steps, [(new tokens, cached tokens) of each prompt]): a scheduler of its own receives
    # its workers' steps summed, with the sum of their prompts' squared spans.
    summed = [
        (1, [(400, 0)]),
        (2, [(300, 0), (900, 128)]),
        (1, [(64, 2048)]),
        (3, [(1500, 0), (20, 0), (700, 64)]),
        (1, [(3000, 0)]),
    ]
    for steps, prompts in summed:
        tokens = sum(t for t, _ in prompts)
        squares = sum((c + t) ** 2 - c**2 for t, c in prompts)
        seconds = sum(cost(t, c) for t, c in prompts) - (len(prompts) - steps) * FIXED
        prefill.add(tokens, seconds, steps, squares)
        clock.now += 1
    figures = prefill.figures()
    assert figures is not None
    assert (figures.line.rate, figures.line.fixed, figures.quadratic) == pytest.approx(
        (RATE, FIXED, QUADRATIC), rel=1e-6
    )


def test_a_linear_engine_or_too_few_steps_give_the_lines_figures() -> None:
    clock = Clock()
    prefill = PrefillCost(10.0, clock)
    assert prefill.figures() is None and prefill.per_second is None and prefill.fit() is None
    for tokens in (100, 900, 300):  # three steps: a parabola fits any three, noise included
        prefill.add(tokens, cost(tokens))
    assert MIN_SAMPLES == 4
    figures = prefill.figures()
    assert figures is not None and figures.quadratic == 0.0
    # An engine whose prefill is a line (SGLang's replay): no attention term, the line's rate.
    linear = PrefillCost(10.0, clock)
    for tokens in (64, 512, 32, 1024, 96, 256):
        linear.add(tokens, 0.020 + tokens / 10_000)
        clock.now += 0.5
    fitted = linear.figures()
    assert fitted is not None and fitted.line.rate == pytest.approx(10_000, rel=1e-6)
    assert fitted.quadratic == pytest.approx(0.0, abs=1e-15)
    # One length only: nothing to fit; the line's ratio of the sums.
    same = PrefillCost(10.0, clock)
    for _ in range(10):
        same.add(400, cost(400))
    alike = same.figures()
    assert alike is not None and not alike.line.separated and alike.quadratic == 0.0
    assert alike.line.rate == pytest.approx(400 / cost(400))


def test_steps_that_cost_less_when_longer_never_give_a_negative_term() -> None:
    # Noise or a cache warming up: the longer steps ran faster a token. No term may be below
    # zero (a prefix would compute in less than no time); the line's figures are used.
    clock = Clock()
    prefill = PrefillCost(10.0, clock)
    for tokens, seconds in [(100, 0.010), (1000, 0.030), (2000, 0.035), (4000, 0.040)]:
        prefill.add(tokens, seconds)
    figures = prefill.figures()
    assert figures is not None and figures.quadratic == 0.0 and figures.line.rate > 0


def test_the_oldest_steps_weigh_least() -> None:
    # The engine got slower (another tenant's prefill beside it): within a few half-lives
    # the fit is the new engine's.
    clock = Clock()
    prefill = PrefillCost(1.0, clock)
    for tokens in (421, 1007, 195, 4096, 96, 2839):
        prefill.add(tokens, cost(tokens))
        clock.now += 0.1
    clock.now += 30
    for tokens in (421, 1007, 195, 4096, 96, 2839):
        prefill.add(tokens, 2 * cost(tokens))
        clock.now += 0.1
    figures = prefill.figures()
    assert figures is not None
    assert figures.line.rate == pytest.approx(RATE / 2, rel=1e-3)
    assert figures.quadratic == pytest.approx(2 * QUADRATIC, rel=1e-3)


@given(
    steps=st.lists(
        st.tuples(st.integers(0, 1 << 20), st.floats(0.0, 1e4), st.integers(1, 64)),
        max_size=40,
    ),
    hours=st.floats(0.0, 1e4),
)
def test_any_steps_give_positive_finite_figures_or_none(
    steps: list[tuple[int, float, int]], hours: float
) -> None:
    clock = Clock()
    prefill = PrefillCost(10.0, clock)
    for tokens, seconds, count in steps:
        prefill.add(tokens, seconds, count)
        clock.now += hours
    figures = prefill.figures()
    if figures is None:
        return
    assert figures.line.rate > 0 and figures.line.fixed >= 0 and figures.quadratic >= 0
    assert figures.seconds(1000) >= 0
