"""The admission strategies: 'none' reports every present page; the gate reports the longest
prefix that restores sooner than it computes, within its margin. Every rate here is injected
(a RestoreOutlook and options), never measured on this machine."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from kvcr_policy.builtin.admission import GateOptions, NoAdmission, RestoreGate, compute_seconds
from kvcr_policy.config.loading import load_config
from kvcr_policy.config.schema import AdmissionSection
from kvcr_policy.errors import ConfigError
from kvcr_policy.registry import NoOptions, Registry
from kvcr_policy.strategies import AdmissionStrategy, RestoreOutlook

SECTION = AdmissionSection()
PAGE_TOKENS, PAGE_BYTES = 64, 16 << 20  # qwen3-32b: 256 KiB a token, 64 tokens a page


rates = st.floats(1e3, 1e12, allow_nan=False, allow_infinity=False)


def gate(**options: object) -> RestoreGate:
    return RestoreGate(SECTION, GateOptions.model_validate({"probe_after_s": None, **options}))


def test_none_reports_every_present_page() -> None:
    strategy = NoAdmission(SECTION, NoOptions())
    assert isinstance(strategy, AdmissionStrategy)
    decision = strategy.admit(12, PAGE_TOKENS, PAGE_BYTES, RestoreOutlook(1.0))
    assert (decision.pages, decision.reason) == (12, "no_gate")


def test_a_tier_faster_than_prefill_is_admitted_whole() -> None:
    # 64 tokens per 16 MiB page at 1,000 tokens/s: 64 ms to compute; 10 GB/s restores in 1.7 ms.
    decision = gate(prefill_tokens_per_s=1000).admit(
        100, PAGE_TOKENS, PAGE_BYTES, RestoreOutlook(10e9)
    )
    assert (decision.pages, decision.reason, decision.declined) == (100, "restores_sooner", "")


def test_a_tier_slower_than_prefill_is_declined_whole() -> None:
    # 50 MB/s: a page in 0.34 s; 10,000 tokens/s computes it in 6.4 ms.
    decision = gate(prefill_tokens_per_s=10_000).admit(
        100, PAGE_TOKENS, PAGE_BYTES, RestoreOutlook(50e6)
    )
    assert (decision.pages, decision.reason, decision.declined) == (
        0,
        "computes_sooner",
        "computes_sooner",
    )


def test_pages_declined_whole_are_not_saved_unless_the_operator_asks() -> None:
    slow, fast = RestoreOutlook(50e6), RestoreOutlook(10e9)
    args = (100, PAGE_TOKENS, PAGE_BYTES)
    assert gate(prefill_tokens_per_s=10_000).admit(*args, slow).save is False
    assert gate(prefill_tokens_per_s=10_000, save_when_declined=True).admit(*args, slow).save
    assert gate(prefill_tokens_per_s=10_000).admit(*args, fast).save  # admitted: saved
    probe = gate(prefill_tokens_per_s=10_000, probe_after_s=1.0)
    stale = RestoreOutlook(50e6, idle_s=5.0)  # a probe measures the tier again: saved
    assert probe.admit(*args, stale).pages == 8 and probe.admit(*args, stale).save


def test_bytes_already_queued_decline_a_short_prefix_and_admit_a_long_one() -> None:
    # Per page: restore 16.8 ms at 1 GB/s, compute 64 ms; 1 GB queued costs 1 s up front.
    fast = gate(prefill_tokens_per_s=1000)
    queued = RestoreOutlook(1e9, queued_bytes=1_000_000_000)
    assert fast.admit(10, PAGE_TOKENS, PAGE_BYTES, queued).pages == 0
    assert fast.admit(40, PAGE_TOKENS, PAGE_BYTES, queued).pages == 40


def test_a_prefill_curve_gives_the_longest_prefix_that_restores_sooner() -> None:
    # The rate varies with the prompt's length: restoring at 1 GB/s (16.8 ms a page) beats
    # computing a short prefix (1,000 tokens/s) but not a long one (100,000 tokens/s).
    curve = gate(prefill_curve={64: 1000, 6400: 100_000})
    decision = curve.admit(100, PAGE_TOKENS, PAGE_BYTES, RestoreOutlook(1e9))
    k = np.arange(1, 101)
    restore = k * PAGE_BYTES / 1e9
    compute = k * PAGE_TOKENS / np.interp(k * PAGE_TOKENS, [64, 6400], [1000, 100_000])
    assert decision.pages == int(np.flatnonzero(restore <= compute)[-1]) + 1
    assert 0 < decision.pages < 100
    assert decision.declined == "computes_sooner"


def test_the_engines_reported_rate_wins_over_the_configured_one() -> None:
    configured = gate(prefill_tokens_per_s=1e9)  # would always decline
    outlook = RestoreOutlook(1e9, prefill_tokens_per_s=100.0)  # the engine says: slow prefill
    assert configured.admit(8, PAGE_TOKENS, PAGE_BYTES, outlook).pages == 8


def test_without_a_compute_rate_or_a_restore_rate_every_page_is_admitted() -> None:
    assert gate().admit(5, PAGE_TOKENS, PAGE_BYTES, RestoreOutlook(1.0)).reason == (
        "no_compute_rate"
    )
    decision = gate(prefill_tokens_per_s=10).admit(5, PAGE_TOKENS, PAGE_BYTES, RestoreOutlook(None))
    assert (decision.pages, decision.reason) == (5, "unmeasured")
    assumed = gate(prefill_tokens_per_s=10_000, restore_bytes_per_s=1e6)
    assert assumed.admit(5, PAGE_TOKENS, PAGE_BYTES, RestoreOutlook(None)).pages == 0


def test_a_tier_idle_past_probe_after_s_is_tried_again_with_a_bounded_probe() -> None:
    probing = gate(prefill_tokens_per_s=10_000, probe_after_s=30, probe_pages=3)
    slow = RestoreOutlook(1e6, idle_s=29.0)
    assert probing.admit(5, PAGE_TOKENS, PAGE_BYTES, slow).pages == 0
    idle = RestoreOutlook(1e6, idle_s=31.0)
    decision = probing.admit(500, PAGE_TOKENS, PAGE_BYTES, idle)
    assert (decision.pages, decision.reason, decision.declined) == (3, "probe", "computes_sooner")
    assert probing.admit(2, PAGE_TOKENS, PAGE_BYTES, idle).pages == 2
    fast = RestoreOutlook(10e9, idle_s=31.0)  # admitted whole on its own: no probe needed
    assert probing.admit(500, PAGE_TOKENS, PAGE_BYTES, fast).reason == "restores_sooner"


def test_a_tier_of_unknown_speed_costs_at_most_probe_pages() -> None:
    # A cold start: nothing measured, nothing configured; a lookup of 10,000 pages reports
    # probe_pages of them, whose restore measures the tier for the next lookup.
    cold = gate(prefill_tokens_per_s=10_000, probe_pages=4)
    decision = cold.admit(10_000, PAGE_TOKENS, PAGE_BYTES, RestoreOutlook(None))
    assert (decision.pages, decision.reason, decision.declined) == (4, "unmeasured", "unmeasured")
    assert cold.admit(3, PAGE_TOKENS, PAGE_BYTES, RestoreOutlook(None)).declined == ""


@given(
    found=st.integers(0, 5000),
    probe_pages=st.integers(1, 64),
    restore=st.one_of(st.none(), rates),
    idle=st.one_of(st.none(), st.floats(0, 100)),
    prefill=st.floats(1.0, 1e7),
)
def test_beyond_a_probe_the_gate_never_admits_a_prefix_that_restores_slower(
    found: int, probe_pages: int, restore: float | None, idle: float | None, prefill: float
) -> None:
    strategy = gate(prefill_tokens_per_s=prefill, probe_after_s=30, probe_pages=probe_pages)
    outlook = RestoreOutlook(restore, idle_s=None if restore is None else idle)
    decision = strategy.admit(found, PAGE_TOKENS, PAGE_BYTES, outlook)
    assert 0 <= decision.pages <= found
    if decision.pages > probe_pages:  # more than a probe: restored sooner than computed
        assert restore is not None
        restore_s = decision.pages * PAGE_BYTES / restore
        assert restore_s <= decision.pages * PAGE_TOKENS / prefill * (1 + 1e-9)


#: Margins a gate takes: none, a share of slack, or a share a restore must be sooner by.
MARGINS = st.one_of(st.just(0.0), st.floats(1e-3, 10.0), st.floats(-0.9, -1e-3))

#: A lookup and the figures a gate decides it on, as the two properties below draw them.
LOOKUPS = {
    "found": st.integers(0, 2000),
    "page_bytes": st.integers(1, 1 << 26),
    "restore": rates,
    "queued": st.integers(0, 1 << 34),
    "prefill": st.floats(1.0, 1e7),
    "margin": MARGINS,
}


@given(page_tokens=st.integers(1, 1024), **LOOKUPS)
def test_the_gate_never_admits_a_prefix_that_restores_slower_than_it_computes_beyond_the_margin(
    found: int,
    page_tokens: int,
    page_bytes: int,
    restore: float,
    queued: int,
    prefill: float,
    margin: float,
) -> None:
    strategy = gate(prefill_tokens_per_s=prefill, margin=margin)
    decision = strategy.admit(
        found, page_tokens, page_bytes, RestoreOutlook(restore, queued_bytes=queued)
    )
    assert 0 <= decision.pages <= found
    if decision.pages:  # the admitted prefix: restored within (1 + margin) of its compute
        restore_s = (queued + decision.pages * page_bytes) / restore
        compute_s = decision.pages * page_tokens / prefill
        assert restore_s <= (1 + margin) * compute_s * (1 + 1e-9)
    # ... and it is the longest such prefix: every longer one restores slower.
    for k in range(decision.pages + 1, found + 1, max(1, found // 50)):
        assert (queued + k * page_bytes) / restore > (1 + margin) * k * page_tokens / prefill * (
            1 - 1e-9
        )


@given(
    page_tokens=st.integers(1, 1024),
    quadratic=st.one_of(st.just(0.0), st.floats(1e-12, 1e-5)),
    fixed=st.floats(0.0, 0.05),
    **LOOKUPS,
)
def test_with_the_engines_attention_term_the_gate_admits_only_what_restores_sooner(
    found: int,
    page_tokens: int,
    page_bytes: int,
    restore: float,
    queued: int,
    prefill: float,
    margin: float,
    quadratic: float,
    fixed: float,
) -> None:
    # The engine reports its prefill as a rate and an attention term (seconds per token
    # squared): computing k pages costs k P / rate + quadratic (k P)**2. The gate's answer is
    # still the longest prefix that restores within (1 + margin) of that.
    strategy = gate(prefill_tokens_per_s=1.0, margin=margin)  # the engine's figures win
    outlook = RestoreOutlook(
        restore,
        queued_bytes=queued,
        prefill_tokens_per_s=prefill,
        restore_fixed_s=fixed,
        prefill_s_per_token2=quadratic,
    )
    decision = strategy.admit(found, page_tokens, page_bytes, outlook)

    def restores_sooner(k: int, slack: float) -> bool:
        compute_s = k * page_tokens / prefill + quadratic * (k * page_tokens) ** 2
        return fixed + (queued + k * page_bytes) / restore <= (1 + margin) * compute_s * slack

    assert 0 <= decision.pages <= found
    if decision.pages:
        assert restores_sooner(decision.pages, 1 + 1e-9)
    for k in range(decision.pages + 1, found + 1, max(1, found // 50)):
        assert not restores_sooner(k, 1 - 1e-9)


def test_a_short_prefix_is_priced_at_its_own_cost_not_a_long_ones() -> None:
    # vLLM on 2 CPU cores (its prefill steps fitted: 163,000 tokens/s and 8.8e-9 s a token
    # pair): 20 pages of 32 tokens compute in 7.5 ms, 88 pages in 87 ms; a restore the engine
    # waits for takes 10.5 ms whatever its size (its steps), 1.4 ms more a MB. Priced on a
    # line through the same steps (34,000 tokens/s) the short prefix would compute in 18.8
    # ms and be restored, at one and a half times its cost.
    line = RestoreOutlook(700e6, prefill_tokens_per_s=34_000.0, restore_fixed_s=0.0105)
    curve = RestoreOutlook(
        700e6, prefill_tokens_per_s=163_000.0, restore_fixed_s=0.0105, prefill_s_per_token2=8.8e-9
    )
    strategy = gate(margin=-0.2)
    assert strategy.admit(20, 32, 32 << 10, line).pages == 20  # the line's mistake
    short = strategy.admit(20, 32, 32 << 10, curve)
    assert short.pages == 0 and short.compute_s == pytest.approx(0.0075, rel=0.02)
    assert strategy.admit(88, 32, 32 << 10, curve).pages == 88


def test_a_configured_rate_takes_no_attention_term() -> None:
    # The term is the engine's, fitted with its own rate: beside a configured rate (the
    # engine reported none) it is not added.
    outlook = RestoreOutlook(1e6, prefill_s_per_token2=1.0)
    decision = gate(prefill_tokens_per_s=1000).admit(4, PAGE_TOKENS, 1000, outlook)
    assert decision.compute_s == pytest.approx(4 * PAGE_TOKENS / 1000)


def test_compute_seconds_is_nan_without_any_rate() -> None:
    assert np.isnan(compute_seconds(np.array([64.0]), GateOptions(), None)).all()


def test_the_gated_profile_is_throughput_plus_the_gate(registry: Registry) -> None:
    gated = load_config("gated", environ={}, registry=registry)
    throughput = load_config("throughput", environ={}, registry=registry).config
    assert gated.config.admission.strategy == "gate"
    assert gated.config.model_copy(update={"admission": AdmissionSection()}) == throughput
    assert "gated.toml [admission]" in gated.origin("admission.strategy")
    assert load_config(environ={}, registry=registry).config.admission.strategy == "none"


def test_a_gate_option_out_of_range_is_refused_with_its_origin(registry: Registry) -> None:
    environ = {"KVCR_POLICY_ADMISSION__OPTIONS__MARGIN": "-1"}
    with pytest.raises(ConfigError) as caught:
        loaded = load_config("gated", environ=environ, registry=registry)
        spec = registry.get("admission", "gate")
        spec.create(loaded.config.admission, options=loaded.config.admission.options)
    assert "margin" in str(caught.value)


@pytest.mark.parametrize("margin", [5e-4, -5e-4, -0.95])
def test_a_margin_too_small_to_mean_anything_or_past_minus_0_9_is_refused(margin: float) -> None:
    with pytest.raises(ValidationError) as caught:
        GateOptions(margin=margin)
    assert "margin" in str(caught.value)


def test_a_negative_margin_declines_a_prefix_that_restores_only_a_little_sooner() -> None:
    # 100 pages restore in 0.9 of their compute: admitted at margin 0, declined at -0.2
    # (a restore must be a fifth sooner), admitted again once it is.
    compute_s = 100 * PAGE_TOKENS / 10_000
    restore = 100 * PAGE_BYTES / (0.9 * compute_s)
    outlook = RestoreOutlook(restore, restore_fixed_s=0.0)
    plain = gate(prefill_tokens_per_s=10_000)
    assert plain.admit(100, PAGE_TOKENS, PAGE_BYTES, outlook).pages == 100
    wary = gate(prefill_tokens_per_s=10_000, margin=-0.2)
    decision = wary.admit(100, PAGE_TOKENS, PAGE_BYTES, outlook)
    assert (decision.pages, decision.reason) == (0, "computes_sooner")
    sooner = RestoreOutlook(restore * 0.9 / 0.75, restore_fixed_s=0.0)
    assert wary.admit(100, PAGE_TOKENS, PAGE_BYTES, sooner).pages == 100


@given(
    found=st.integers(1, 3000),
    restore=rates,
    queued=st.integers(0, 1 << 32),
    prefill=st.floats(1.0, 1e7),
    margin=MARGINS,
)
def test_one_prefill_rate_decides_in_one_step_as_the_per_length_arithmetic_does(
    found: int, restore: float, queued: int, prefill: float, margin: float
) -> None:
    # At one rate the gate checks only the whole prefix (the difference of restore and
    # compute is linear in k); a curve of one point takes the per-k path: the same answer.
    outlook = RestoreOutlook(restore, queued_bytes=queued)
    one = gate(prefill_tokens_per_s=prefill, margin=margin)
    curve = gate(prefill_curve={1: prefill}, margin=margin)
    quick, each = (g.admit(found, 64, 4096, outlook) for g in (one, curve))
    whole = (queued + found * 4096) / restore / ((1 + margin) * found * 64 / prefill)
    if abs(whole - 1) > 1e-9:  # off the exact break-even, where rounding may differ
        assert (quick.pages, quick.reason) == (each.pages, each.reason)


def test_before_any_restore_the_rate_the_stores_measured_decides() -> None:
    # A tier that wrote at 50 MB/s is declined before it restored anything (no probe); a
    # configured restore rate, then a measured one, take precedence over the stores' rate.
    strategy = gate(prefill_tokens_per_s=10_000)
    stored = RestoreOutlook(None, store_bytes_per_s=50e6)
    assert strategy.admit(100, PAGE_TOKENS, PAGE_BYTES, stored).reason == "computes_sooner"
    configured = gate(prefill_tokens_per_s=10_000, restore_bytes_per_s=10e9)
    assert configured.admit(100, PAGE_TOKENS, PAGE_BYTES, stored).pages == 100
    measured = RestoreOutlook(10e9, store_bytes_per_s=50e6)
    assert strategy.admit(100, PAGE_TOKENS, PAGE_BYTES, measured).pages == 100


@given(fixed=st.floats(0.0, 10.0), **LOOKUPS)
def test_a_restores_fixed_seconds_count_once_and_never_let_a_slower_prefix_in(
    found: int,
    page_bytes: int,
    restore: float,
    fixed: float,
    queued: int,
    prefill: float,
    margin: float,
) -> None:
    # The restores' fit: seconds = fixed + bytes / rate. The admitted prefix restores within
    # (1 + margin) of its compute, counting the call's fixed seconds once; every longer one
    # does not.
    strategy = gate(prefill_tokens_per_s=prefill, margin=margin)
    outlook = RestoreOutlook(restore, queued_bytes=queued, restore_fixed_s=fixed)
    decision = strategy.admit(found, 64, page_bytes, outlook)
    assert 0 <= decision.pages <= found

    def slower(k: int) -> float:  # restore over (1 + margin) compute
        return (fixed + (queued + k * page_bytes) / restore) / ((1 + margin) * k * 64 / prefill)

    if decision.pages:
        assert slower(decision.pages) <= 1 + 1e-9
    for k in range(decision.pages + 1, found + 1, max(1, found // 50)):
        assert slower(k) > 1 - 1e-9


def test_restores_that_cannot_tell_their_fixed_seconds_apart_give_way_to_a_prior() -> None:
    # Restores of one size cannot tell a call's fixed seconds from its rate: a configured
    # rate, else the stores', is the rate, and the mean restore's seconds beyond its bytes at
    # that rate are the call's fixed part (here 1 s: 1 MB took 1 s, at 10 GB/s 0.1 ms).
    strategy = gate(prefill_tokens_per_s=10_000)
    mean = (1e6, 1.0)
    unseparated = RestoreOutlook(
        1e6, store_bytes_per_s=10e9, restore_fixed_s=None, restore_call=mean, restore_calls=5
    )
    long = strategy.admit(1000, PAGE_TOKENS, PAGE_BYTES, unseparated)
    assert long.pages == 1000 and long.restore_s == pytest.approx(
        1.0 - 1e6 / 10e9 + 1000 * PAGE_BYTES / 10e9
    )
    assert strategy.admit(10, PAGE_TOKENS, PAGE_BYTES, unseparated).pages == 0  # 1 s > 64 ms
    fitted = RestoreOutlook(1e6, store_bytes_per_s=10e9, restore_fixed_s=0.0, restore_calls=5)
    assert strategy.admit(1000, PAGE_TOKENS, PAGE_BYTES, fitted).pages == 0
    configured = gate(prefill_tokens_per_s=10_000, restore_bytes_per_s=1e6)
    fast = RestoreOutlook(10e9, restore_fixed_s=None, restore_call=(1e9, 0.1), restore_calls=1)
    assert configured.admit(1000, PAGE_TOKENS, PAGE_BYTES, fast).pages == 0
    alone = RestoreOutlook(1e6, restore_fixed_s=None, restore_call=mean, restore_calls=1)
    decision = gate(prefill_tokens_per_s=10_000, probe_pages=4).admit(
        100, PAGE_TOKENS, PAGE_BYTES, alone
    )  # nothing else known: its own rate, and a bounded probe rather than a decline
    assert (decision.pages, decision.reason, decision.declined) == (4, "probe", "computes_sooner")
    settled = RestoreOutlook(1e6, restore_fixed_s=None, restore_call=mean, restore_calls=3)
    assert gate(prefill_tokens_per_s=10_000).admit(100, PAGE_TOKENS, PAGE_BYTES, settled).pages == 0
