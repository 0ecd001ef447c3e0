"""The replay's set-up refuses what it cannot run, with the option, what it expects and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcr_policy.errors import ReplayError
from kvcr_policy.replay.setup import DEFAULT_TRACE, ReplaySetup
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
    ],
)
def test_a_setup_that_cannot_run_is_refused(fields: dict, says: str) -> None:
    fields.setdefault("trace", TRACE)
    with pytest.raises(ReplayError, match=says.replace("(", r"\(")):
        ReplaySetup(**fields)


def test_each_engine_has_its_own_block_size() -> None:
    assert ReplaySetup(engine="vllm", trace=TRACE).block_tokens == 32
    assert ReplaySetup(engine="sglang", trace=TRACE).block_tokens == 512
