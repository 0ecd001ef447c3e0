"""``kvcr-policy plan --trace``: Mooncake's conversation trace as the FAST'25 paper describes it,
figures that hold together, inputs refused before any replay, the curve, the real-bytes check."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.commands import run_main
from tests.support.paths import ROOT

pytestmark = pytest.mark.usefixtures("clean_env")

TRACES = ROOT / "data" / "traces"
CONVERSATION = str(TRACES / "conversation_trace.jsonl.xz")
DONE = ["--trace", CONVERSATION, "--capacity-tokens", "1000000,3000000,10000000,50000000"]
Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """``cli(*argv)``: ``kvcr-policy plan ARGV`` in-process, in an 80-column terminal."""
    monkeypatch.setenv("COLUMNS", "80")
    return lambda *argv: run_main(capsys, "plan", *argv)


def _json(cli: Run, *argv: str) -> dict[str, Any]:
    code, out, err = cli(*argv, "--format", "json")
    assert code == 0, err
    return dict(json.loads(out))


def test_the_paper_s_curve(cli: Run) -> None:
    """FAST'25 section 5.3: a 3M-token cache reaches well under half of what an unbounded one
    would, and about 50M tokens come close to the maximum."""
    plan = _json(cli, *DONE, "--eviction", "lru", "--tp", "8", "--link-limit", "20GB/s")
    trace = plan["trace"]
    assert (trace["requests"], trace["block_references"], trace["distinct_blocks"]) == (
        12031,
        288500,
        182790,
    )
    (lru,) = plan["evictions"]
    rows = {row["capacity_tokens"]: row for row in lru["capacities"]}
    best = trace["max_hit_rate"]
    assert 0 < rows[3_000_000]["hit_rate"] < 0.5 * best
    assert rows[50_000_000]["hit_rate"] > 0.95 * best
    rates = [row["hit_rate"] for row in lru["capacities"]]
    assert rates == sorted(rates) and rates[-1] <= best
    assert lru["smallest_capacity_tokens_for_90pct_of_max"] == 50_000_000
    assert lru["eviction"] == "lru" and lru["eviction_from"] == "--eviction"


def test_the_figures_hold_together(cli: Run) -> None:
    plan = _json(cli, *DONE, "--tp", "8", "--host-memory", "2TiB", "--link-limit", "20GB/s")
    trace, geo = plan["trace"], plan["geometry"]
    assert geo["bytes_per_token_rank"] == 32 << 10  # qwen3-32b by default, tp 8
    assert geo["bytes_per_block_rank"] == 8 * (2 << 20)  # 512 tokens = 8 pages of 2 MiB
    (configured,) = plan["evictions"]
    assert configured["eviction"] == "lru" and configured["eviction_from"] == "default"
    for row in configured["capacities"]:
        blocks = row["capacity_tokens"] // 512
        assert row["capacity_blocks"] == blocks
        assert row["hit_rate"] == pytest.approx(row["hit_tokens"] / trace["input_tokens"])
        assert row["tier_bytes_per_rank"] == blocks * geo["bytes_per_block_rank"]
        assert row["tier_bytes_per_host"] == 8 * row["tier_bytes_per_rank"]
        assert row["fits_host"] == (row["tier_bytes_per_host"] <= 2 << 40)
        rate = row["hit_tokens"] * (32 << 10) / trace["duration_s"]
        assert row["restore_bytes_per_s_rank"] == pytest.approx(rate)
        assert row["link_share"] == pytest.approx(8 * rate / 20e9)  # the host's 8 ranks
    assert plan["link"] == {"gigabytes_per_s": 20.0, "from": "--link-limit", "per": "host",
                            "ranks_sharing": 8, "gigabytes_per_s_per_rank": 2.5}  # fmt: skip


def test_the_table_names_each_strategy(cli: Run) -> None:
    code, out, err = cli(*DONE, "--eviction", "lru,fifo,s3fifo", "--tp", "8")
    assert code == 0, err
    for heading in ("eviction lru (from --eviction)", "eviction s3fifo (from --eviction)",
                    "most reachable hit rate: 37.4%", "12031 requests"):  # fmt: skip
        assert heading in out
    assert "capacity  hit rate  of max  tier/rank" in out


def test_without_capacities_the_profile_s_tier_is_replayed(cli: Run) -> None:
    plan = _json(cli, "--trace", CONVERSATION, "--set", "placement.capacity_bytes=64GiB")
    (row,) = plan["evictions"][0]["capacities"]
    assert row["capacity_tokens"] == (64 << 30) // (128 << 20) * 512  # whole blocks of 128 MiB
    assert row["capacity_from"] == "placement.capacity_bytes 68719476736 (from override)"


def test_the_configured_eviction_and_its_options_are_used(cli: Run) -> None:
    args = ["--set", "eviction.strategy=s3fifo", "--set", "eviction.options.small_share=0.2"]
    plan = _json(cli, *DONE, *args)
    (configured,) = plan["evictions"]
    assert configured["eviction"] == "s3fifo" and configured["eviction_from"] == "override"
    assert configured["options"] == {"small_share": 0.2, "promote_reads": 1}
    asked = _json(cli, *DONE, *args, "--eviction", "s3fifo")["evictions"][0]
    assert asked["options"] == configured["options"]  # the configured strategy's own options
    assert asked["capacities"] == configured["capacities"]


def test_the_curve_is_drawn(cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "curve.svg"
    code, _, err = cli(*DONE, "--eviction", "lru,fifo", "--plot", str(path), "--tp", "8",
                       "--host-memory", "2TiB")  # fmt: skip
    assert code == 0, err
    svg = path.read_text(encoding="utf-8")
    assert svg.startswith("<?xml") and "<svg" in svg and "no capacity limit (37.4%)" in svg
    # 2 TiB over 8 ranks of 32 KiB a token: 8.39M tokens of tier fit the host
    assert "host memory (8.39M tokens fit)" in svg


def test_real_bytes_agree_with_the_model(cli: Run) -> None:
    args = ["--capacity-tokens", "100000,1000000", "--eviction", "lru,s3fifo", "--bytes", "300"]
    plan = _json(cli, "--trace", CONVERSATION, *args)
    found = plan["bytes_replays"]
    assert [(f["eviction"], f["capacity_tokens"]) for f in found] == [
        ("lru", 100000), ("lru", 1000000), ("s3fifo", 100000), ("s3fifo", 1000000),
    ]  # fmt: skip
    for replay in found:
        assert replay["agrees"] and replay["problems"] == []
        assert replay["hit_blocks"] == replay["model_hit_blocks"] == replay["pages_verified"]


def test_real_bytes_that_differ_exit_1(cli: Run) -> None:
    code, out, err = cli("--trace", CONVERSATION, "--capacity-tokens", "100000", "--bytes", "300",
                         "--set", "backend.name=dict", "--set",
                         "backend.options.capacity_pages=40")  # fmt: skip
    assert code == 1
    assert "DIFFERS from the model" in out
    assert "the replay with real bytes differs from the model" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--capacity-tokens", "100"],
            "capacity 100 tokens (from --capacity-tokens) holds no block",
        ),
        (["--capacity-tokens", "2000G"], "is more than the 1099511627776 tokens"),
        (["--capacity-tokens", "1M,,3M"], "no empty item"),
        (["--capacity-tokens", "1M,1M"], "1M listed twice"),
        (["--capacity-tokens", "1e6"], "'1e6' is not a token count"),
        (["--capacity-tokens", "99999999999999999"], "is not a token count"),
        (
            ["--block-tokens", "2097152"],
            "'--block-tokens': Input should be less than or equal to 1048576",
        ),
        (["--block-tokens", "1024"], "line 1: 14 hash_ids for input_length 6758, more than its 7"),
        (["--eviction", "lfu"], "--eviction: no eviction strategy 'lfu' (registered: fifo, lru"),
        (["--tokens", "1000"], "--tokens sizes a tier for a token count; --trace replays"),
        (["--bytes", "0"], "'--bytes': Input should be greater than or equal to 1"),
        (["--plot", "curve.txt"], "--plot curve.txt: has suffix '.txt'"),
        (["--link-limit", "nan"], "expected a rate, a number and a unit"),
        (["--link-gbps", "inf"], "expected a rate, a number and a unit"),
        (["--link-limit", "50"], "got a bare number '50'"),
        (["--link-limit", "200TB/s"], "expected a rate from 0.001GB/s to 100000GB/s"),
        (["--geometry", "qwen3-32b", "--capacity-tokens", "100G"], "more than the 256TiB"),
    ],
)
def test_bad_input_is_refused_with_one_message(cli: Run, args: list[str], message: str) -> None:
    code, out, err = cli("--trace", CONVERSATION, *args)
    assert code == 2
    assert message in err, err
    assert "Traceback" not in err and out == ""


def test_a_malformed_line_is_refused_with_its_number(cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    good = '{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}'
    path.write_text(f'{good}\n{good}\n{{"timestamp": 0, "input_length": 600}}\n')
    code, _, err = cli("--trace", str(path))
    assert code == 2
    assert f"trace {path} line 3: missing hash_ids" in err


@pytest.mark.parametrize("option", [["--capacity-tokens", "1M"], ["--eviction", "lru"],
                                    ["--bytes", "3"], ["--block-tokens", "512"]])  # fmt: skip
def test_trace_options_need_a_trace(cli: Run, option: list[str]) -> None:
    code, _, err = cli("--tokens", "1000", "--geometry", "small", *option)
    assert code == 2
    assert f"{option[0]} go with --trace FILE" in err


def test_plan_needs_tokens_or_a_trace(cli: Run) -> None:
    code, _, err = cli("--geometry", "small")
    assert code == 2
    assert "plan needs --tokens N (tokens the tier holds) or --trace FILE" in err


def test_a_measured_link_is_compared(cli: Run, tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    rows = [{"timestamp": 1000 * i, "input_length": 4096, "hash_ids": list(range(8))}
            for i in range(4)]  # fmt: skip
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    plan = _json(cli, "--trace", str(path), "--capacity-tokens", "4096", "--geometry", "small",
                 "--measure-link")  # fmt: skip
    assert plan["link"]["from"].startswith("measured here") and plan["link"]["gigabytes_per_s"] > 0
    (row,) = plan["evictions"][0]["capacities"]
    assert row["hit_tokens"] == 3 * 4096  # every request after the first hits all 8 blocks
    rate = row["hit_tokens"] * plan["geometry"]["bytes_per_token_rank"] / 3.0
    assert row["restore_bytes_per_s_rank"] == pytest.approx(rate)
    assert row["link_share"] == pytest.approx(rate / (plan["link"]["gigabytes_per_s"] * 1e9))


def test_every_pool_counts_in_the_tier_and_the_restores(cli: Run) -> None:
    one = _json(cli, *DONE, "--tp", "8", "--link-limit", "20GB/s")["evictions"][0]["capacities"]
    two = _json(cli, *DONE, "--tp", "8", "--link-limit", "20GB/s", "--pools", "2")
    for single, double in zip(one, two["evictions"][0]["capacities"], strict=True):
        assert double["hit_tokens"] == single["hit_tokens"]
        for key in ("tier_bytes_per_rank", "restore_bytes_per_s_rank", "link_share"):
            assert double[key] == pytest.approx(2 * single[key])


def test_the_largest_capacity_that_fits_the_host_stands_next_to_the_90_pct_line(cli: Run) -> None:
    """2 TiB, 8 ranks: 3M tokens (0.73 TiB per host) fits, 10M (2.4 TiB) and 50M do not, and
    50M is the one reaching 90 % of the most reachable."""
    argv = (*DONE, "--tp", "8", "--host-memory", "2TiB")
    plan = _json(cli, *argv)
    (lru,) = plan["evictions"]
    assert lru["smallest_capacity_tokens_for_90pct_of_max"] == 50_000_000
    assert lru["largest_capacity_tokens_that_fits_host"] == 3_000_000
    assert any("10000000, 50000000 tokens need more tier" in w for w in plan["warnings"])
    assert any("50000000 tokens, does not fit" in w and "fits is 3000000" in w
               for w in plan["warnings"])  # fmt: skip
    code, out, err = cli(*argv)
    assert code == 0, err
    assert "(smallest listed) (does not fit the host)" in out
    assert "largest listed that fits the host: 3M tokens" in out


def test_a_warning_says_when_no_listed_capacity_fits(cli: Run) -> None:
    plan = _json(cli, *DONE, "--tp", "8", "--host-memory", "25GB")
    assert all(r["fits_host"] is False for r in plan["evictions"][0]["capacities"])
    assert plan["evictions"][0]["largest_capacity_tokens_that_fits_host"] is None
    assert any(w.startswith("no listed capacity fits the host's") for w in plan["warnings"])
