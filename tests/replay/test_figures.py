"""Percentiles and the comparison of the two runs."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.replay.figures import compare, percentile, summarize

values = st.lists(st.floats(0, 1e3, allow_nan=False), min_size=1, max_size=50)


@given(values, st.integers(1, 100))
def test_a_percentile_is_a_value_with_enough_below_it(data: list[float], q: int) -> None:
    p = percentile(data, q)
    assert p in data
    assert sum(v <= p for v in data) * 100 >= q * len(data)
    assert sum(v < p for v in data) * 100 < q * len(data) or p == min(data)


def test_no_values_no_percentile() -> None:
    assert percentile([], 50) is None


def test_the_comparison_reads_the_measured_pass() -> None:
    def record(pass_: int, ttft: float, cached: int) -> dict:
        return {"pass": pass_, "ttft_s": ttft, "prompt_tokens": 100, "cached_tokens": cached}

    base = {"measured": summarize([record(0, 9, 0), record(1, 1.0, 0)], 1)}
    tier = {
        "measured": summarize([record(0, 9, 0), record(1, 0.1, 90)], 1),
        "hit_tokens": 90,
        "bytes_restored": 900,
    }
    head = compare(base, tier)
    assert head["ttft_p50_s"] == 0.1 and head["baseline_ttft_p50_s"] == 1.0
    assert head["prefill_tokens_saved"] == 90 and head["prefill_tokens_computed"] == 10
