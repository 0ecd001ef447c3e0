"""No win without evidence: the confirmation rule on hand-made measurements."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.tune.verdict import judge
from tests.strategies import rates
from tests.tune.measured import result


def test_a_clear_win_in_both_orders_wins() -> None:
    pairs = [(11.0, 10.0), (11.2, 10.1), (10.9, 9.9), (11.1, 10.0), (11.0, 10.05)]
    verdict = judge(result({"P,Q": pairs, "Q,P": pairs}))
    assert verdict.wins and verdict.reasons() == []
    assert 0.09 < verdict.gain < 0.11
    assert verdict.to_dict()["orders"]["P,Q"]["wins"] is True


def test_a_win_in_one_order_only_is_no_win() -> None:
    win = [(11.0, 10.0), (11.1, 10.0), (11.0, 10.1)]
    small_loss = [(9.8, 10.0), (9.9, 10.0), (9.85, 10.0)]  # within the 5 % screen
    verdict = judge(result({"P,Q": win, "Q,P": small_loss}))
    assert verdict.screen.passed
    assert not verdict.wins
    assert verdict.reasons() == ["order base, then tuned: no gain (-1.5 %)"]


def test_a_gain_inside_the_spread_of_the_repeats_is_no_win() -> None:
    noisy = [(13.0, 10.0), (10.2, 10.0), (8.0, 10.0), (10.3, 10.0), (12.5, 10.0)]
    verdict = judge(result({"P,Q": noisy, "Q,P": noisy}))
    order = verdict.orders[0]
    assert 0 < order.gain < order.spread
    assert not verdict.wins
    assert "within the spread of the repeats" in verdict.reasons()[0]


def test_a_regression_beyond_the_screen_is_named() -> None:
    loss = [(8.0, 10.0)] * 3
    verdict = judge(result({"P,Q": loss, "Q,P": loss}))
    assert verdict.screen.failed_orders == ("P,Q", "Q,P")
    assert "more than 5 % below the start" in verdict.reasons()[0]


def test_too_few_repeats_or_unverified_bytes_are_no_evidence() -> None:
    two = [(20.0, 10.0), (20.0, 10.0)]
    assert "fewer than 3" in judge(result({"P,Q": two, "Q,P": two})).reasons()[0]
    three = [(20.0, 10.0)] * 3
    unverified = judge(result({"P,Q": three, "Q,P": three}, verified=False))
    assert not unverified.wins and "did not match" in unverified.reasons()[0]


def test_one_order_alone_is_no_win() -> None:
    assert not judge(result({"P,Q": [(20.0, 10.0)] * 3})).wins


@given(st.lists(st.tuples(rates, rates), min_size=3, max_size=9))
def test_a_win_always_means_a_positive_gain_beyond_the_spread_in_each_order(
    pairs: list[tuple[float, float]],
) -> None:
    verdict = judge(result({"P,Q": pairs, "Q,P": list(reversed(pairs))}))
    if verdict.wins:
        assert all(o.gain > max(o.spread, 0) for o in verdict.orders)
        assert verdict.screen.passed
    # The same pairs with the sides swapped can never win too.
    swapped = [(q, p) for p, q in pairs]
    assert not (verdict.wins and judge(result({"P,Q": swapped, "Q,P": swapped})).wins)


def test_each_order_is_described_by_one_statistic_whose_sign_is_the_verdicts() -> None:
    # Paired in the same moment P loses every time, yet P's median rate is higher than Q's:
    # the two medians come from different moments. The description states only the paired
    # statistic, so no line reads "before 1.92, after 2.82, gain -16.9 %".
    pairs = [(10.0, 11.0), (1.0, 1.1), (1.0, 1.1), (5.0, 1.0), (5.0, 1.0)]
    order = judge(result({"P,Q": pairs, "Q,P": pairs})).orders[0]
    assert order.after_gbps > order.before_gbps and order.gain < 0
    text = order.describe()
    assert "before" not in text and "after" not in text and "GB/s" not in text
    assert f"tuned/base {1 + order.gain:.3f} = {order.gain * 100:+.1f} %" in text
    assert "median of 5 pairs taken in the same moment" in text
