"""BenchResult's figures against values computed by hand from a small set of runs.

Four runs per side with different limits (the backend's and the host memory copy's), chosen so
that a median of ratios differs from a ratio of medians: a formula that took the wrong one
would fail here.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvcr_policy.bench import BenchResult, Run, Screen


def make(runs: list[Run], baseline: str = "Q", **fields: Any) -> BenchResult:
    values: dict[str, Any] = dict(
        target="cpu",
        backend="dram",
        geometry="small",
        layout="layer_first",
        mla=False,
        tokens=256,
        pages=16,
        page_bytes=1 << 19,
        nbytes=16 << 19,
        scatter=False,
        repeat=2,
        baseline=baseline,
        runs=tuple(runs),
        limit="one copy",
        profiles={"P": {"name": "p", "path": None}, baseline: {"name": "q", "path": None}},
        store_gbps={"P": 4.0, baseline: 0.5},
        store_host_copy_gbps={"P": 8.0, baseline: 2.0},
        limit_short="one copy",
    )
    values.update(fields)
    return BenchResult(**values)


def run(
    rep: int, order: str, side: str, gbps: float, limit: float, host: float = 40.0, ok: bool = True
) -> Run:
    return Run(rep, order, side.lower(), side, gbps, limit, ok, host)


# (repeat, order, side, restore GB/s, limit GB/s and host copy GB/s right before it)
RUNS = [
    run(0, "P,Q", "P", 10, 20, 40),
    run(0, "P,Q", "Q", 5, 10, 25),
    run(0, "Q,P", "Q", 4, 8, 16),
    run(0, "Q,P", "P", 12, 16, 20),
    run(1, "P,Q", "P", 8, 10, 32),
    run(1, "P,Q", "Q", 8, 16, 20),
    run(1, "Q,P", "Q", 6, 12, 30),
    run(1, "Q,P", "P", 9, 18, 18),
]


def test_medians_and_ratios_by_hand() -> None:
    result = make(RUNS)
    assert result.restore_gbps("P") == 9.5  # median of 8, 9, 10, 12
    assert result.restore_gbps("Q") == 5.5  # median of 4, 5, 6, 8
    assert result.limit_gbps == 14.0  # median of 8, 10, 10, 12, 16, 16, 18, 20
    assert result.ratio_to_limit("P") == 0.625  # median of 0.5, 0.75, 0.8, 0.5
    assert result.ratio_to_limit("Q") == 0.5
    assert result.host_copy_limit_gbps == 22.5  # median of 16, 18, 20, 20, 25, 30, 32, 40
    # 0.25, 0.6, 0.25, 0.5: median 0.375 (the ratio of medians would be 9.5 / 22.5 = 0.422).
    assert result.ratio_to_host_copy_limit("P") == 0.375
    assert result.ratio_to_host_copy_limit("Q") == 0.225  # 0.2, 0.25, 0.4, 0.2
    # Same-moment ratios 2, 3, 1, 1.5: median 1.75 (the ratio of medians would be 1.727).
    assert result.speedup_vs_baseline == 1.75
    assert result.restore_gbps("P", "P,Q") == 9.0 and result.restore_gbps("Q", "Q,P") == 5.0


def test_json_keys_and_rounding() -> None:
    data = make(RUNS, exists_keys_per_s={"P": 1234.4, "Q": 99.6}).to_dict()
    expected = {
        "bytes": 16 << 19,
        "verified": True,
        "limit_short": "one copy",
        "limit_gigabytes_per_s": 14.0,
        "host_copy_limit_gigabytes_per_s": 22.5,
        "restore_gigabytes_per_s": 9.5,
        "baseline_gigabytes_per_s": 5.5,
        "ratio_to_limit": 0.625,
        "baseline_ratio_to_limit": 0.5,
        "ratio_to_host_copy_limit": 0.375,
        "baseline_ratio_to_host_copy_limit": 0.225,
        "speedup_vs_baseline": 1.75,
        "store_gigabytes_per_s": 4.0,
        "baseline_store_gigabytes_per_s": 0.5,
        "store_host_copy_limit_gigabytes_per_s": 8.0,
        "store_ratio_to_host_copy_limit": 0.5,
        "baseline_store_ratio_to_host_copy_limit": 0.25,
        "exists_keys_per_s": 1234,
        "baseline_exists_keys_per_s": 100,
    }
    assert {key: data[key] for key in expected} == expected
    assert "query_keys_per_s" not in data  # the same figure as exists_keys_per_s: one key
    assert data["orders"] == {
        "P,Q": {
            "restore_gigabytes_per_s": 9.0,
            "baseline_gigabytes_per_s": 6.5,
            "ratio_to_limit": 0.65,
            "baseline_ratio_to_limit": 0.5,
            "ratio_to_host_copy_limit": 0.25,
            "baseline_ratio_to_host_copy_limit": 0.3,
        },
        "Q,P": {
            "restore_gigabytes_per_s": 10.5,
            "baseline_gigabytes_per_s": 5.0,
            "ratio_to_limit": 0.625,
            "baseline_ratio_to_limit": 0.5,
            "ratio_to_host_copy_limit": 0.55,
            "baseline_ratio_to_host_copy_limit": 0.225,
        },
    }
    assert data["runs"][3] == {
        "repeat": 0,
        "order": "Q,P",
        "profile": "p",
        "side": "P",
        "restore_gigabytes_per_s": 12,
        "limit_gigabytes_per_s": 16,
        "ratio_to_limit": 0.75,
        "host_copy_limit_gigabytes_per_s": 20,
        "ratio_to_host_copy_limit": 0.6,
        "verified": True,
    }
    assert list(data)[-1] == "runs"
    assert "peer_gigabytes_per_s" not in data


def test_a_peer_implementation_adds_the_peer_keys() -> None:
    runs = [
        Run(r.repeat, r.order.replace("Q", "peer"), r.profile, r.side.replace("Q", "peer"),
            r.restore_gbps, r.limit_gbps, r.verified, r.host_copy_gbps)
        for r in RUNS
    ]  # fmt: skip
    data = make(runs, baseline="peer", extra={"peer": "hicache-file"}).to_dict()
    assert data["baseline_ratio_to_host_copy_limit"] == 0.225
    assert data["peer"] == "hicache-file"
    assert (data["peer_gigabytes_per_s"], data["speedup_vs_peer"]) == (5.5, 1.75)
    assert (data["peer_store_gigabytes_per_s"], data["store_speedup_vs_peer"]) == (0.5, 8.0)
    assert set(data["orders"]) == {"P,peer", "peer,P"}
    assert "baseline_exists_keys_per_s" not in data


def test_one_unverified_restore_fails_the_result() -> None:
    bad = [*RUNS[:-1], run(1, "Q,P", "P", 9, 18, 18, ok=False)]
    assert make(RUNS).verified is True
    assert make(bad).verified is False
    assert make(bad).to_dict()["verified"] is False
    assert make([]).verified is False


def test_screen_fails_the_order_where_p_falls_more_than_the_margin_below() -> None:
    runs = [
        run(0, "P,Q", "P", 9.6, 20),
        run(0, "P,Q", "Q", 10, 20),
        run(0, "Q,P", "Q", 10, 20),
        run(0, "Q,P", "P", 9.4, 20),
    ]
    result = make(runs)
    assert result.screen(5) == Screen(5, ("Q,P",))
    assert result.screen(5).to_dict() == {"percent": 5, "passed": False, "failed_orders": ["Q,P"]}
    assert result.screen(10).passed is True
    assert make(RUNS).screen(0).passed is True  # P faster in every order


def test_a_missing_side_is_an_error_not_a_zero() -> None:
    with pytest.raises(ValueError, match="no run of side 'Q'"):
        make(RUNS[:1]).restore_gbps("Q")
