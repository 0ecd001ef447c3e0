"""``replay --engine sglang``: SGLang's real HiCacheController on the CPU, without storage and
with our backend; every page that reaches the device is checked against its key's bytes. At TP
2 each rank is a process (a gloo group) and both reach one host tier: with an MLA model only
rank 0 writes, and rank 1's hits are pages rank 0 stored."""

from __future__ import annotations

import pytest

from kvcr_policy.replay.command import replay
from kvcr_policy.replay.setup import DEFAULT_TRACE, ReplaySetup
from tests.integrations.conftest import SGLANG_MISSING, sglang_installed
from tests.support.installs import missing
from tests.support.paths import ROOT

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

PAGE, PAGE_BYTES = 64, 4096  # kvcr_policy/replay/sglang_stack.py


@pytest.mark.parametrize(("tp", "mla"), [(1, False), (2, True)])
def test_the_tier_serves_the_second_visit_with_the_same_kv(tp: int, mla: bool) -> None:
    if not sglang_installed():
        missing(SGLANG_MISSING)
    setup = ReplaySetup(
        engine="sglang", trace=ROOT / DEFAULT_TRACE, requests=6 if tp == 1 else 4,
        profile="default", tp=tp, mla=mla,
    )  # fmt: skip
    result = replay(setup)
    assert result["outputs_identical"] is True
    tier, base = result["runs"]["tier"], result["runs"]["baseline"]
    assert tier["mismatched_pages"] == 0 and base["mismatched_pages"] == 0
    assert result["hit_tokens"] > 0 and base["hit_tokens"] == 0
    assert result["prefill_tokens_saved"] == result["hit_tokens"]
    assert result["bytes_restored"] == result["hit_tokens"] // PAGE * PAGE_BYTES * tp
    assert tier["prefill_s_per_token"] == base["prefill_s_per_token"] > 0
    counters = tier["backend_counters"]
    # A computed page is backed up once per writing rank, and an MLA model's pages by rank 0
    # only: at least every page the first pass computed, at most every page computed (SGLang
    # skips a page storage has). Every rank reads each page it hits.
    writers = 1 if mla else tp
    first, every = (sum(p["prefill_tokens_computed"] for p in tier["passes"][:n]) // PAGE
                    for n in (1, len(tier["passes"])))  # fmt: skip
    assert first * writers <= counters["pages_written"] <= every * writers
    assert counters["pages_read"] == tp * result["hit_tokens"] // PAGE


def test_a_gated_tier_behind_a_limited_peer_is_compared_with_ungated_and_no_tier() -> None:
    """Three runs: no tier, throughput and gated, each over a `serve` of its own limited to
    2 MB/s a tenant. Which pages the gate admits depends on the rates measured on this
    machine, so the test asks only that every decision is counted and outputs never change."""
    if not sglang_installed():
        missing(SGLANG_MISSING)
    setup = ReplaySetup(
        engine="sglang", trace=ROOT / DEFAULT_TRACE, requests=4, profile="gated",
        vs="throughput", backend="peer", tier_rate="2MB/s",
    )  # fmt: skip
    result = replay(setup)
    assert result["outputs_identical"] is True
    assert set(result["runs"]) == {"no_tier", "baseline", "tier"}
    assert result["no_tier_ttft_p50_s"] is not None and result["tier_rate"] == "2MB/s"
    assert result["ttft_paired_vs_best"] > 0  # request by request, against a run of the round
    runs = result["runs"]
    assert not any("request_ttft_s" in run for run in runs.values())  # compared, not reported
    assert all(run["mismatched_pages"] == 0 for run in runs.values())
    counters = runs["tier"]["backend_counters"]
    decided = counters.get("admitted_pages", 0) + counters.get("declined_pages", 0)
    assert decided > 0  # the gate decided every lookup that found pages
    # A page declined is computed, and its write left out (the tier holds it) at most once.
    assert counters["declined_writes_skipped"] <= counters.get("declined_pages", 0)
    assert "declined_pages" not in runs["baseline"]["backend_counters"]  # throughput: no gate
