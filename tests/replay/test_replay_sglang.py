"""``replay --engine sglang``: SGLang's real HiCacheController on the CPU, without storage and
with our backend; every page that reaches the device is checked against its key's bytes."""

from __future__ import annotations

import pytest

from kvcr_policy.replay.command import replay
from kvcr_policy.replay.setup import DEFAULT_TRACE, ReplaySetup
from tests.integrations.conftest import SGLANG_MISSING, sglang_installed
from tests.support.installs import missing
from tests.support.paths import ROOT

pytestmark = [pytest.mark.sglang, pytest.mark.slow]


def test_the_tier_serves_the_second_visit_with_the_same_kv() -> None:
    if not sglang_installed():
        missing(SGLANG_MISSING)
    setup = ReplaySetup(engine="sglang", trace=ROOT / DEFAULT_TRACE, requests=8, profile="default")
    result = replay(setup)
    assert result["outputs_identical"] is True
    tier, base = result["runs"]["tier"], result["runs"]["baseline"]
    assert tier["mismatched_pages"] == 0 and base["mismatched_pages"] == 0
    assert result["hit_tokens"] > 0 and base["hit_tokens"] == 0
    assert result["prefill_tokens_saved"] == result["hit_tokens"]
    assert result["bytes_restored"] == result["hit_tokens"] // 64 * 4096
    assert tier["prefill_s_per_token"] == base["prefill_s_per_token"] > 0
