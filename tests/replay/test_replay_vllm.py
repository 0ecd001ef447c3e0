"""``replay --engine vllm``: a real vLLM engine on the CPU, without and with our connector."""

from __future__ import annotations

import pytest

from kvcr_policy.replay.command import replay
from kvcr_policy.replay.setup import DEFAULT_TRACE, ReplaySetup
from kvcr_policy.replay.vllm_model import BLOCK_BYTES, BLOCK_SIZE
from tests.integrations.vllm.conftest import need_vllm
from tests.support.paths import ROOT

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_the_tier_serves_the_second_visit_and_outputs_do_not_change() -> None:
    need_vllm()
    setup = ReplaySetup(engine="vllm", trace=ROOT / DEFAULT_TRACE, requests=5, profile="default")
    result = replay(setup)
    assert result["outputs_identical"] is True
    tier = result["runs"]["tier"]
    assert result["hit_tokens"] > 0
    assert result["prefill_tokens_saved"] > 0
    assert result["bytes_restored"] == result["hit_tokens"] // BLOCK_SIZE * BLOCK_BYTES
    assert tier["load_failed_pages"] == 0
