"""The replay's text report: the verdict, both runs side by side, the ratio to the better of
the other arms and every round."""

from __future__ import annotations

from typing import Any

from kvcr_policy.replay.figures import summarize
from kvcr_policy.replay.report import render
from kvcr_policy.replay.rounds import run_rounds, summarize_rounds
from kvcr_policy.replay.setup import ReplaySetup
from tests.support.paths import ROOT


class Given:
    """An engine whose TTFT is given per (round, label)."""

    capacity = 1 << 20

    def __init__(self, ttft: dict[str, list[float]]) -> None:
        self.ttft, self.count = ttft, dict.fromkeys(ttft, 0)

    def run(self, label: str, profile: str | None, tier: dict[str, Any]) -> dict[str, Any]:
        n, self.count[label] = self.count[label], self.count[label] + 1
        record = {"pass": 1, "ttft_s": self.ttft[label][n], "prompt_tokens": 64}
        measured = summarize([dict(record, cached_tokens=0 if profile is None else 64)], 1)
        return {"measured": measured, "hit_tokens": 64, "bytes_restored": 4096}


def test_the_report_names_the_ratio_to_the_best_and_every_round() -> None:
    setup = ReplaySetup(
        engine="sglang",
        trace=ROOT / "data/traces/conversation_trace.jsonl.xz",
        profile="gated",
        vs="throughput",
        repeat=2,
    )
    rounds = run_rounds(setup, Given({"no_tier": [2.0, 3.0], "baseline": [0.5, 0.4],
                                      "tier": [0.25, 0.4]}))  # fmt: skip
    result = dict(
        summarize_rounds(rounds), engine="sglang", baseline="throughput", outputs_identical=True,
        measured_pass=1, passes=1, requests=1, trace="t", repeat=2, runs=rounds[-1],
    )  # fmt: skip
    text = render(result)
    assert "TTFT p50 x0.75, p90 x0.75 (medians of each round's own ratio)" in text
    assert "round 1 (no_tier, baseline, tier): TTFT p50 250.0 ms with the tier" in text
    assert "round 2 (baseline, tier, no_tier)" in text
