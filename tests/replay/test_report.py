"""The replay's text report: the verdict, both runs side by side, the ratio to the better of
the other arms and every round."""

from __future__ import annotations

from kvcr_policy.replay.report import render
from kvcr_policy.replay.rounds import run_rounds, summarize_rounds
from tests.support.replays import GivenTTFT, gated_setup


def report(engine: GivenTTFT, repeat: int, requests: int) -> str:
    """The text report of ``repeat`` rounds of a gated replay on ``engine``."""
    rounds = run_rounds(gated_setup(repeat=repeat), engine)
    result = dict(
        summarize_rounds(rounds), engine="sglang", baseline="throughput", outputs_identical=True,
        measured_pass=1, passes=1, requests=requests, trace="t", repeat=repeat, runs=rounds[-1],
    )  # fmt: skip
    return render(result)


def test_the_report_names_the_ratio_to_the_best_and_every_round() -> None:
    ttft = {"no_tier": [2.0, 3.0], "baseline": [0.5, 0.4], "tier": [0.25, 0.4]}
    text = report(GivenTTFT(ttft), repeat=2, requests=1)
    assert "TTFT p50 x0.75, p90 x0.75 (medians of each round's own ratio)" in text
    assert "round 1 (no_tier, baseline, tier): TTFT p50 250.0 ms with the tier" in text
    assert "round 2 (baseline, tier, no_tier)" in text


def test_the_report_gives_the_paired_ratio() -> None:
    per_request = {"no_tier": [[2.0, 4.0]], "baseline": [[0.5, 1.0]], "tier": [[0.5, 1.1]]}
    engine = GivenTTFT({arm: [0.0] for arm in per_request}, per_request=per_request)
    text = report(engine, repeat=1, requests=2)
    assert "its own in the better of the others: median x1.05" in text
