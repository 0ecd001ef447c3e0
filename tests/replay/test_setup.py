"""The replay's set-up refuses what it cannot run, with the option, what it expects and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcr_policy.errors import ReplayError
from kvcr_policy.replay.setup import DEFAULT_TRACE, ReplaySetup, labelled_runs
from tests.support.paths import ROOT

TRACE = ROOT / DEFAULT_TRACE


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"engine": "trt"}, "--engine: expected vllm or sglang"),
        ({"engine": "vllm", "requests": 0}, "--requests: expected 1 to 2000"),
        ({"engine": "vllm", "tp": 2}, "drop --tp and --mla"),
        ({"engine": "vllm", "block_tokens": 48}, "multiple of 32"),
        ({"engine": "sglang", "passes": 1}, "--passes: expected 2 to 4"),
        ({"engine": "sglang", "tp": 3}, "--tp: expected 1 or 2"),
        ({"engine": "sglang", "trace": Path("no/such.jsonl")}, "is not a file"),
        ({"engine": "sglang", "tier_rate": "50MB/s"}, "add --backend peer"),
        ({"engine": "sglang", "backend": "peer", "tier_rate": "50"}, "--tier-rate: expected a"),
        ({"engine": "sglang", "repeat": 0}, "--repeat: expected 1 to 12 rounds"),
        ({"engine": "vllm", "repeat": 13}, "--repeat: expected 1 to 12 rounds"),
    ],
)
def test_a_setup_that_cannot_run_is_refused(fields: dict, says: str) -> None:
    fields.setdefault("trace", TRACE)
    with pytest.raises(ReplayError, match=says.replace("(", r"\(")):
        ReplaySetup(**fields)


def test_each_engine_has_its_own_block_size() -> None:
    assert ReplaySetup(engine="vllm", trace=TRACE).block_tokens == 32
    assert ReplaySetup(engine="sglang", trace=TRACE).block_tokens == 512


def test_a_baseline_profile_adds_a_run_without_the_tier() -> None:
    plain = ReplaySetup(engine="sglang", trace=TRACE, profile="gated")
    assert labelled_runs(plain) == [("baseline", None), ("tier", "gated")]
    versus = ReplaySetup(
        engine="sglang", trace=TRACE, profile="gated", vs="throughput", backend="peer",
        tier_rate="50MB/s",
    )  # fmt: skip
    assert labelled_runs(versus) == [
        ("no_tier", None), ("baseline", "throughput"), ("tier", "gated"),
    ]  # fmt: skip
    assert versus.tier_bytes_per_s == 50e6
