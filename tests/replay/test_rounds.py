"""The replay's rounds: every arm once a round, in orders that rotate and reverse, and the
headline as medians over the rounds. The engine here records the order it was asked in and
returns given figures: what is tested is the driver; the engines' own runs are tested in
test_replay_sglang.py and test_replay_vllm.py."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.replay.rounds import orders, run_rounds, summarize_rounds
from kvcr_policy.replay.setup import ReplaySetup
from tests.support.paths import ROOT
from tests.support.replays import GivenTTFT, gated_setup

ARMS = ["no_tier", "baseline", "tier"]


@given(st.integers(1, 4))
def test_every_arm_takes_every_place_and_both_orders(cycles: int) -> None:
    chosen = orders(ARMS, 2 * len(ARMS) * cycles)
    assert all(sorted(order) == sorted(ARMS) for order in chosen)
    places = Counter((place, arm) for order in chosen for place, arm in enumerate(order))
    assert set(places.values()) == {2 * cycles}  # each arm in each place equally often
    pairs = Counter((a, b) for order in chosen for a, b in itertools.pairwise(order))
    assert len(pairs) == len(ARMS) * (len(ARMS) - 1)  # every arm ran before and after each


def test_one_round_runs_in_the_given_order() -> None:
    assert orders(ARMS, 1) == [ARMS]


def test_the_headline_is_the_median_over_rounds_and_every_round_is_kept() -> None:
    setup = gated_setup(repeat=3)
    engine = GivenTTFT({"no_tier": [3.0, 1.0, 2.0], "baseline": [0.5, 0.4, 9.0], "tier": [0.3] * 3})
    rounds = run_rounds(setup, engine)
    assert [label for label, _ in engine.asked] == [a for order in orders(ARMS, 3) for a in order]
    assert dict(engine.asked) == {"no_tier": None, "baseline": "throughput", "tier": "gated"}
    head = summarize_rounds(rounds)
    assert head["no_tier_ttft_p50_s"] == 2.0 and head["baseline_ttft_p50_s"] == 0.5
    assert head["ttft_p50_s"] == 0.3
    assert [r["order"] for r in head["rounds"]] == orders(ARMS, 3)
    assert [r["baseline_ttft_p50_s"] for r in head["rounds"]] == [0.5, 0.4, 9.0]


def test_one_round_reports_its_own_values_and_no_rounds() -> None:
    setup = ReplaySetup(engine="sglang", trace=ROOT / "data/traces/conversation_trace.jsonl.xz")
    rounds = run_rounds(setup, GivenTTFT({"baseline": [1.0], "tier": [0.25]}))
    head = summarize_rounds(rounds)
    assert head["ttft_p50_s"] == 0.25 and "rounds" not in head


def test_the_ratio_to_the_best_is_the_median_of_each_rounds_own_ratio() -> None:
    # Round 3 ran on a machine that slowed everything: its ratio is 1.0, yet the median of
    # the tier's TTFT (0.5) over the median of the baseline's (0.4) would say 1.25.
    setup = gated_setup(repeat=3)
    engine = GivenTTFT(
        {"no_tier": [9.0, 9.0, 90.0], "baseline": [0.4, 0.2, 5.0], "tier": [0.38, 0.5, 5.0]}
    )
    head = summarize_rounds(run_rounds(setup, engine))
    assert [r["ttft_p50_vs_best"] for r in head["rounds"]] == [0.95, 2.5, 1.0]
    assert head["ttft_p50_vs_best"] == 1.0
    assert head["ttft_p50_s"] / head["baseline_ttft_p50_s"] == 1.25


def test_the_ratio_takes_no_tier_when_it_is_the_better() -> None:
    setup = gated_setup()
    engine = GivenTTFT({"no_tier": [0.2], "baseline": [0.8], "tier": [0.3]})
    head = summarize_rounds(run_rounds(setup, engine))
    assert head["ttft_p50_vs_best"] == 1.5


def test_one_requests_noise_moves_the_p50_by_a_gap_and_the_paired_ratio_not() -> None:
    # A trace's TTFTs near the median lie apart (requests differ in length and hits): here
    # 5 ms. In the tier's run the middle request alone ran 30 % faster...
    baseline = [0.010, 0.015, 0.020, 0.025, 0.030]
    tier = [0.010, 0.015, 0.014, 0.025, 0.030]
    per_request = {"baseline": [baseline], "tier": [tier]}
    engine = GivenTTFT({"baseline": [0.0], "tier": [0.0]}, per_request=per_request)
    setup = ReplaySetup(engine="sglang", trace=ROOT / "data/traces/conversation_trace.jsonl.xz")
    head = summarize_rounds(run_rounds(setup, engine))
    # ...so the p50 of each run alone moves to the next request's (x0.75), while request by
    # request the runs are the same.
    assert head["ttft_p50_vs_best"] == 0.75
    assert head["ttft_paired_vs_best"] == 1.0


def test_the_paired_ratio_is_against_the_arm_with_the_better_p50_of_each_round() -> None:
    setup = gated_setup(repeat=3)
    per_request = {
        "no_tier": [[1.0, 2.0, 3.0], [0.1, 0.2, 0.3], [1.0, 1.0, 1.0]],
        "baseline": [[0.5, 0.5, 0.5], [1.0, 1.0, 1.0], [0.5, 1.0, 2.0]],
        "tier": [[0.5, 1.0, 1.5], [0.2, 0.2, 0.3], [0.5, 1.0, 2.0]],
    }
    engine = GivenTTFT({arm: [0.0] * 3 for arm in per_request}, per_request=per_request)
    head = summarize_rounds(run_rounds(setup, engine))
    # round 1: the baseline is better (p50 0.5), ratios 1, 2, 3; round 2: no tier (0.2), 2, 1,
    # 1; round 3: the baseline (1.0 against no tier's 1.0: the first of the two), all 1.
    assert [r["ttft_paired_vs_best"] for r in head["rounds"]] == [2.0, 1.0, 1.0]
    assert head["ttft_paired_vs_best"] == 1.0


def test_no_paired_ratio_without_per_request_ttfts() -> None:
    head = summarize_rounds(
        run_rounds(gated_setup(), GivenTTFT({"no_tier": [1.0], "baseline": [1.0], "tier": [1.0]}))
    )
    assert head["ttft_paired_vs_best"] is None
