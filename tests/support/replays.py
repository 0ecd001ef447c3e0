"""A replay's driver under test: the set-up of a gated replay against ``throughput`` with
``--vs``, and an engine whose time to first token is given per run (what is tested is the
driver; the engines' own runs are tested in tests/replay/test_replay_*.py)."""

from __future__ import annotations

from typing import Any

from kvcr_policy.replay.figures import summarize
from kvcr_policy.replay.setup import ReplaySetup
from tests.support.paths import ROOT

__all__ = ["GivenTTFT", "gated_setup"]


def gated_setup(repeat: int = 1) -> ReplaySetup:
    """An SGLang replay of the vendored trace, ``gated`` against ``throughput``, with ``--vs``
    (three arms: no tier, baseline, tier), ``repeat`` rounds."""
    return ReplaySetup(
        engine="sglang",
        trace=ROOT / "data/traces/conversation_trace.jsonl.xz",
        profile="gated",
        vs="throughput",
        repeat=repeat,
    )


class GivenTTFT:
    """An engine that records its runs (``asked``: label and profile, in order); the TTFT of
    each is given per label, one value a round, or with ``per_request`` one list of the
    requests' TTFTs a round (then reported request by request too)."""

    capacity = 1 << 20

    def __init__(
        self, ttft: dict[str, list[float]], per_request: dict[str, list[list[float]]] | None = None
    ) -> None:
        self.ttft, self.per_request, self.asked = ttft, per_request or {}, []

    def run(self, label: str, profile: str | None, tier: dict[str, Any]) -> dict[str, Any]:
        n = sum(1 for asked, _ in self.asked if asked == label)
        self.asked.append((label, profile))
        given = self.per_request.get(label)
        values = given[n] if given else [self.ttft[label][n]]
        cached = 0 if profile is None else 64
        records = [
            {"pass": 1, "ttft_s": value, "prompt_tokens": 64, "cached_tokens": cached}
            for value in values
        ]
        figures = {
            "measured": summarize(records, 1),
            "hit_tokens": 64,
            "bytes_restored": 4096,
            "outputs": [],
        }
        if given:
            figures["request_ttft_s"] = list(values)
        return figures
