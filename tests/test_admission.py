"""Pipeline.admit and its AdmissionDesk: the live figures a lookup decides on, the decision
counted in the desk and in ``kvcr_policy_admission_pages``. Rates are injected (configured or
added to the desk), never taken from this machine's speed."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from kvcr_policy.admission import AdmissionDesk
from kvcr_policy.builtin.admission import GateOptions, RestoreGate
from kvcr_policy.config.schema import AdmissionSection
from kvcr_policy.observability.marginal import MIN_SAMPLES, MarginalRate
from tests.support.pipelines import Build, build, stored_pool
from tests.support.pools import P, token_indices

__all__ = ["build"]  # the rig's fixture, used here

SLOW = {
    "admission.strategy": "gate",
    "admission.options": {"prefill_tokens_per_s": 1e6, "restore_bytes_per_s": 1.0},
}


def test_the_default_profile_admits_every_present_page(build: Build) -> None:
    pipeline, _, _, _, keys = stored_pool(build, n=6)
    assert pipeline.admit(pipeline.exists(keys)) == 6
    assert pipeline.admission.counts == {("admitted", "no_gate"): 6}


def test_a_slow_tier_is_declined_and_counted_in_metrics(build: Build) -> None:
    pipeline, _, _, _, keys = stored_pool(build, "gated", SLOW, n=6)
    assert pipeline.admit(pipeline.exists(keys), ["kv"]) == 0
    assert pipeline.admission.counts == {("declined", "computes_sooner"): 6}
    labels = {"backend": "dram", "profile": "gated", "pool": "kv"}
    declined = {**labels, "decision": "declined", "reason": "computes_sooner"}
    assert (REGISTRY.get_sample_value("kvcr_policy_admission_pages_total", declined) or 0) >= 6


def test_a_lookup_the_gate_declines_whatever_is_present_is_known_before_asking(
    build: Build,
) -> None:
    pipeline, *_ = stored_pool(build, "gated", SLOW, n=6)
    labels = {"backend": "dram", "profile": "gated", "pool": "kv"}
    declined = {**labels, "decision": "declined", "reason": "computes_sooner"}
    before = REGISTRY.get_sample_value("kvcr_policy_admission_pages_total", declined) or 0
    decided = pipeline.declines(8, ["kv"])  # 1 B/s: no run of pages restores sooner
    assert decided is not None and decided.pages == 0
    # Counted as a lookup of 8 pages, every one declined (the tier is not asked).
    assert pipeline.admission.counts == {("declined", "computes_sooner"): 8}
    after = REGISTRY.get_sample_value("kvcr_policy_admission_pages_total", declined) or 0
    assert after - before == 8
    assert len(pipeline.admission.declined) == 0  # no keys: nothing noted


def test_a_lookup_the_gate_may_admit_is_asked_of_the_tier(build: Build) -> None:
    pipeline, *_ = stored_pool(build, "gated", SLOW, n=3)
    pipeline.prefill_observed(1, 1e6)  # the engine: one token in 11 days
    assert pipeline.declines(8, ["kv"]) is None
    ungated, *_ = stored_pool(build, n=3)
    assert ungated.declines(8) is None  # the default profile: every present page is a hit


def test_a_measured_fast_tier_replaces_the_assumed_rate(build: Build) -> None:
    pipeline, geo, *_ = stored_pool(build, "gated", SLOW, n=6)
    pipeline.admission.restores.add(geo.page_bytes * 1e9, 1.0)  # injected: 1e9 pages a second
    assert pipeline.admit(6) == 0  # one restore is no measurement yet: the assumed rate
    for calls in (2, 4):  # restores of other sizes tell their fixed seconds apart: none
        pipeline.admission.restores.add(calls * geo.page_bytes * 1e9, calls)
    pipeline.admission.counts.clear()
    assert pipeline.admit(6) == 6
    assert pipeline.admission.counts == {("admitted", "restores_sooner"): 6}


def test_a_restore_feeds_the_rate_and_leaves_nothing_queued(build: Build) -> None:
    pipeline, _, _, _, keys = stored_pool(build, "gated", SLOW, n=4)
    assert pipeline.admission.outlook().bytes_per_s is None
    assert pipeline.get(keys, token_indices(range(8, 12), P)) == [True] * 4
    outlook = pipeline.admission.outlook()
    assert outlook.bytes_per_s is not None and outlook.bytes_per_s > 0
    assert outlook.queued_bytes == 0 and outlook.idle_s is not None


def test_the_engines_prefill_rate_is_used_when_reported(build: Build) -> None:
    pipeline, *_ = stored_pool(build, "gated", SLOW, n=3)
    pipeline.prefill_observed(1, 1e6)  # the engine: one token in 11 days
    assert pipeline.admission.outlook().prefill_tokens_per_s == pytest.approx(1e-6)
    assert pipeline.admit(3) == 3


def test_queued_bytes_count_while_a_restore_runs_and_the_decision_is_explained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    options = GateOptions(prefill_tokens_per_s=1000, probe_after_s=None)
    desk = AdmissionDesk(RestoreGate(AdmissionSection(), options), clock=lambda: now[0])
    desk.restores = MarginalRate(10.0, lambda: now[0])
    for _ in range(MIN_SAMPLES):
        desk.restores.add(1e9, 1.0)  # 1 GB/s
    # One page: 1 MB restores in 1 ms, 64 tokens compute in 64 ms; 1 GB queued: 1 s first.
    assert desk.decide("kv", 1, 64, 1_000_000, None) == 1
    with desk.restoring(1_000_000_000), caplog.at_level(logging.DEBUG, "kvcr_policy.admission"):
        assert desk.outlook().queued_bytes == 1_000_000_000
        assert desk.decide("kv", 1, 64, 1_000_000, None) == 0
    assert desk.outlook().queued_bytes == 0
    assert "0 of 1 present pages admitted (computes_sooner)" in caplog.text
    assert "1000000000 queued" in caplog.text and "1000.0 MB/s" in caplog.text


def test_stores_in_flight_count_as_queued_beside_restores() -> None:
    # A tier that paces a tenant's reads and writes together delivers a restore behind both.
    options = GateOptions(prefill_tokens_per_s=1000, probe_after_s=None)
    desk = AdmissionDesk(RestoreGate(AdmissionSection(), options))
    for _ in range(MIN_SAMPLES):
        desk.restores.add(1e9, 1.0)  # injected: 1 GB/s
    assert desk.decide("kv", 1, 64, 1_000_000, None) == 1
    with desk.storing(600_000_000), desk.restoring(400_000_000):
        assert desk.queued == (400_000_000, 600_000_000)
        assert desk.outlook().queued_bytes == 1_000_000_000
        assert desk.decide("kv", 1, 64, 1_000_000, None) == 0  # 1 s queued, 64 ms compute
    assert desk.queued == (0, 0)


def test_a_store_is_queued_while_it_moves_and_not_after(build: Build) -> None:
    pipeline, geo, *_ = stored_pool(build, "gated", SLOW, n=4)
    seen: list[tuple[int, int]] = []
    write = pipeline._mover.write

    def watched(*args: object, **kwargs: object) -> object:
        seen.append(pipeline.admission.queued)  # what a lookup would see during the store
        return write(*args, **kwargs)

    pipeline._mover.write = watched  # type: ignore[method-assign]
    assert pipeline.set(["s0", "s1", "s2"], token_indices(range(12, 15), P)) == [True] * 3
    assert seen and seen[0] == (0, 3 * geo.page_bytes)
    assert pipeline.admission.queued == (0, 0)
    outlook = pipeline.admission.outlook()  # the stores measured the link; no restore yet
    assert outlook.store_bytes_per_s is not None and outlook.bytes_per_s is None


def test_a_steps_fixed_cost_does_not_make_computing_look_dearer() -> None:
    # The engine's prefill-only steps, injected: 20 ms a step, then 10,000 tokens/s. Over
    # these short steps tokens / seconds is 2,038 tokens/s: a page of 32 tokens would seem to
    # compute in 15.7 ms, slower than its restore at 4 MB/s (8.2 ms). It adds 3.2 ms to a
    # step the request runs anyway: computing wins.
    now = [0.0]
    options = GateOptions(probe_after_s=None)
    desk = AdmissionDesk(RestoreGate(AdmissionSection(), options), clock=lambda: now[0])
    for _ in range(MIN_SAMPLES):
        desk.restores.add(4e6, 1.0)
    for tokens in (32, 32, 64, 32, 96):
        desk.prefills.add(tokens, 0.020 + tokens / 10_000)
        now[0] += 0.3
    assert desk.outlook().prefill_tokens_per_s == pytest.approx(10_000)
    assert desk.decide("kv", 4, 32, 32 * 1024, None) == 0
    ratio = AdmissionDesk(RestoreGate(AdmissionSection(), options), clock=lambda: now[0])
    for _ in range(MIN_SAMPLES):
        ratio.restores.add(4e6, 1.0)
    ratio.prefills.add(256, 5 * 0.020 + 256 / 10_000, 5)  # the same steps summed: no fit
    assert ratio.decide("kv", 4, 32, 32 * 1024, None) == 4


# The vLLM replay's pages (32 tokens, 32 KiB), its prefill fitted at 5,400 tokens/s, a tier
# paced at 20 MB/s: a page restores in 1.6 ms and computes in 5.9 ms. Injected, as measured
# there on a busy machine, where each restore call also waited 150 ms whatever its size.
PAGE_TOKENS, PAGE_BYTES, PREFILL, TIER, CALL_S = 32, 32 << 10, 5400.0, 20e6, 0.15


def replay_desk(now: list[float]) -> AdmissionDesk:
    options = GateOptions(margin=0.1, probe_after_s=30)
    desk = AdmissionDesk(RestoreGate(AdmissionSection(), options), clock=lambda: now[0])
    for tokens in (271, 115, 27, 426, 96):  # prefill-only steps: no fixed cost
        desk.prefills.add(tokens, tokens / PREFILL)
    for pages in (20, 8, 3, 44, 170):  # the first pass's saves: the link, written
        desk.stores.add(pages * PAGE_BYTES, 0.005 + pages * PAGE_BYTES / TIER)
    return desk


def test_one_slow_first_restore_does_not_decline_every_later_lookup() -> None:
    # The first restore of the measured pass, 12 pages, took 126 ms (3.1 MB/s). A gate on
    # that rate declined all 56 later lookups of the pass (a declined lookup restores, so
    # measures, nothing) and computed prompts of up to 5,449 tokens that restore in a
    # fraction of it. Until the restores tell their fixed seconds apart, the stores' 20 MB/s
    # is the rate and the call's 106 ms beyond it its fixed part: a short prefix computes
    # (13 pages: 127 ms against 77 ms), a long one restores (170: 385 ms against 1.0 s).
    now = [0.0]
    desk = replay_desk(now)
    desk.restores.add(12 * PAGE_BYTES, 0.126)
    assert desk.outlook().restore_fixed_s is None
    assert desk.decide("kv", 13, PAGE_TOKENS, PAGE_BYTES, None) == 0
    assert desk.decide("kv", 170, PAGE_TOKENS, PAGE_BYTES, None) == 170


def test_before_any_restore_an_engine_timed_restore_costs_at_least_a_step() -> None:
    # vLLM's first restore of a run (13 pages, 416 tokens) was admitted on the stores' rate
    # alone (2.2 ms against 5.5 ms of compute, no fixed part known) and took 2.4 times the
    # TTFT of computing: the request waited for the step that reports its load. Where the
    # engine times its restores, its steps' fixed part (here 8 ms) is the least a restore's
    # fixed part can be until one is timed: a short prefix computes, a long one restores.
    now = [0.0]
    desk = AdmissionDesk(
        RestoreGate(AdmissionSection(), GateOptions(probe_after_s=None)), clock=lambda: now[0]
    )
    for pages in (20, 8, 3, 44, 170):
        desk.stores.add(pages * PAGE_BYTES, 0.005 + pages * PAGE_BYTES / 200e6)
    for tokens in (32, 416, 64, 1024, 96):  # prefill-only steps: 8 ms, then 75,000 tokens/s
        desk.prefills.add(tokens, 0.008 + tokens / 75_000)
        now[0] += 0.1
    assert desk.decide("kv", 13, PAGE_TOKENS, PAGE_BYTES, None) == 13  # the engine untimed
    desk.engine_times_restores = True
    assert desk.outlook().step_fixed_s == pytest.approx(0.008)
    assert desk.decide("kv", 13, PAGE_TOKENS, PAGE_BYTES, None) == 0
    assert desk.decide("kv", 170, PAGE_TOKENS, PAGE_BYTES, None) == 170
    desk.restores.add(13 * PAGE_BYTES, 0.003)  # a restore timed: its own call decides now
    assert desk.decide("kv", 13, PAGE_TOKENS, PAGE_BYTES, None) == 13


def test_restores_of_one_size_keep_long_prefixes_restoring() -> None:
    # Three restores of 12 and 13 pages, 120 to 170 ms each: too alike to tell a call's
    # fixed seconds from its rate, and bytes over seconds says 2.8 MB/s, at which every
    # later lookup was declined. Against the stores' 20 MB/s, a prompt of 44 pages restores
    # in 0.21 s and computes in 0.26 s; one of 3 pages computes.
    now = [0.0]
    desk = replay_desk(now)
    for pages, seconds in ((12, 0.120), (13, 0.152), (13, 0.170)):
        desk.restores.add(pages * PAGE_BYTES, seconds)
        now[0] += 0.4
    assert desk.outlook().restore_fixed_s is None
    assert desk.decide("kv", 44, PAGE_TOKENS, PAGE_BYTES, None) == 44
    assert desk.decide("kv", 3, PAGE_TOKENS, PAGE_BYTES, None) == 0


def test_a_restores_fixed_cost_is_paid_once_a_call_not_once_a_page() -> None:
    # Restores of 3 to 40 pages, each 150 ms plus its bytes at 20 MB/s: bytes over seconds
    # says 2.6 MB/s, and a prompt of 170 pages would seem to restore in 2.2 s (it takes
    # 0.43 s) against 1.0 s to compute: declined, the slowest requests made slower. Fitted,
    # the call's 150 ms is paid once: a long prefix restores sooner, a short one (4 pages:
    # 157 ms against 24 ms) computes.
    now = [0.0]
    desk = replay_desk(now)
    for pages in (4, 12, 8, 40, 3, 13):
        desk.restores.add(pages * PAGE_BYTES, CALL_S + pages * PAGE_BYTES / TIER)
        now[0] += 0.5
    outlook = desk.outlook()
    assert outlook.bytes_per_s == pytest.approx(TIER, rel=1e-6)
    assert outlook.restore_fixed_s == pytest.approx(CALL_S, rel=1e-6)
    assert desk.decide("kv", 170, PAGE_TOKENS, PAGE_BYTES, None) == 170
    assert desk.decide("kv", 4, PAGE_TOKENS, PAGE_BYTES, None) == 0
    assert desk.counts == {("admitted", "restores_sooner"): 170, ("declined", "computes_sooner"): 4}


def test_without_any_prior_the_first_restores_probe_rather_than_decline() -> None:
    # Nothing configured, nothing stored: the few restores' own rate decides, and a lookup
    # it would decline restores a probe, until MIN_SAMPLES restores measured the tier.
    options = GateOptions(prefill_tokens_per_s=PREFILL, probe_pages=8, probe_after_s=None)
    desk = AdmissionDesk(RestoreGate(AdmissionSection(), options))
    desk.restores.add(PAGE_BYTES, 1.0)  # one page in a second
    assert desk.decide("kv", 100, PAGE_TOKENS, PAGE_BYTES, None) == 8
    assert desk.counts == {("admitted", "probe"): 8, ("declined", "computes_sooner"): 92}
    for _ in range(MIN_SAMPLES - 1):
        desk.restores.add(PAGE_BYTES, 1.0)
    assert desk.decide("kv", 100, PAGE_TOKENS, PAGE_BYTES, None) == 0  # measured: slow


def test_an_engine_that_times_its_restores_replaces_the_get_calls_timing(build: Build) -> None:
    """``Pipeline.restored``: the seconds a request waited for its restored pages (vLLM's
    connector: from the lookup to the load's end) are the restore rate; the pipeline's own get
    calls then add nothing to it (their bytes still count as queued while they run)."""
    pipeline, geo, _, _, keys = stored_pool(build, "gated", SLOW, n=6)
    pipeline.admission.engine_times_restores = True
    assert pipeline.get(keys, token_indices(range(8, 14), P)) == [True] * 6
    assert pipeline.admission.restores.figures() is None  # the get call: not a restore figure
    pipeline.restored(6, 0.5, ["kv"])
    figures = pipeline.admission.restores.figures()
    assert figures is not None
    assert figures.rate == pytest.approx(6 * geo.page_bytes / 0.5)
    assert pipeline.admission.queued == (0, 0)


def test_an_engines_attention_keeps_short_prefixes_computing_and_long_ones_restoring() -> None:
    # vLLM's prefill-only steps on 2 CPU cores, as one replay timed them (2.3 ms a step,
    # 163,000 tokens/s, 8.8e-9 s a token pair: 421 tokens 5.4 ms, 4,096 tokens 178 ms), and
    # its restores as the engine waits for them (10.5 ms a call, 700 MB/s). Fitted on a line,
    # the steps said 34,000 tokens/s and a prefix of 20 pages (640 tokens) computed in 18.8 ms
    # against 11.4 ms to restore: admitted, and the request waited longer than computing.
    now = [0.0]
    desk = AdmissionDesk(
        RestoreGate(AdmissionSection(), GateOptions(margin=-0.2, probe_after_s=None)),
        clock=lambda: now[0],
    )
    desk.engine_times_restores = True
    for tokens in (421, 1007, 195, 4096, 96, 2839, 626, 1616):
        desk.prefills.add(tokens, 0.0023 + tokens / 163_000 + 8.8e-9 * tokens**2)
        now[0] += 0.2
    for pages in (13, 88, 29, 46):
        desk.restores.add(pages * PAGE_BYTES, 0.0105 + pages * PAGE_BYTES / 700e6)
        now[0] += 0.2
    outlook = desk.outlook()
    assert outlook.prefill_tokens_per_s == pytest.approx(163_000, rel=1e-6)
    assert outlook.prefill_s_per_token2 == pytest.approx(8.8e-9, rel=1e-6)
    assert desk.decide("kv", 20, PAGE_TOKENS, PAGE_BYTES, None) == 0
    assert desk.declines("kv", 20, PAGE_TOKENS, PAGE_BYTES, None) is not None  # without asking
    assert desk.decide("kv", 88, PAGE_TOKENS, PAGE_BYTES, None) == 88
    line = MarginalRate(10.0, lambda: now[0])  # the same steps on a line: 20 pages admitted
    for tokens in (421, 1007, 195, 4096, 96, 2839, 626, 1616):
        line.add(tokens, 0.0023 + tokens / 163_000 + 8.8e-9 * tokens**2)
    rate = line.per_second
    assert rate is not None and 20 * PAGE_TOKENS / rate * 0.8 > 0.0105 + 20 * PAGE_BYTES / 700e6
