"""``plan``'s break-even prefix per backend (below it, recomputing wins), from given rates:
the gate's arithmetic with nothing queued, checked against a plain loop."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.builtin.admission import GateOptions
from kvcr_policy.errors import ArgumentError
from kvcr_policy.plan.break_even import break_even, restore_rates
from tests.support.commands import run_main

pytestmark = pytest.mark.usefixtures("clean_env")

Run = Callable[..., tuple[int, str, str]]
QWEN = ["--geometry", "qwen3-32b", "--tokens", "100000", "--prefix-tokens", "32768"]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv("COLUMNS", "80")
    return lambda *argv: run_main(capsys, "plan", *argv)


def test_each_backend_gets_its_break_even_from_the_given_rates(cli: Run) -> None:
    code, out, _ = cli(
        *QWEN, "--link-limit", "10GB/s", "--restore-rate", "peer=50MB/s",
        "--prefill-rate", "5000", "--format", "json",
    )  # fmt: skip
    assert code == 0
    rows = {row["backend"]: row for row in json.loads(out)["break_even"]}
    # qwen3-32b: 16 MiB and 64 tokens a page; 5,000 tokens/s computes a page in 12.8 ms.
    assert rows["dram"]["tokens"] == 64  # 1.7 ms a page: restoring always wins
    assert rows["dram"]["rate_from"] == "--link-limit"
    assert rows["peer"]["tokens"] is None  # 336 ms a page: recomputing always wins
    code, text, _ = cli(*QWEN, "--restore-rate", "peer=50MB/s", "--prefill-rate", "5000")
    assert "break-even peer at 50.0 MB/s (--restore-rate): recomputing wins at every" in text


def test_without_a_prefill_rate_the_plan_says_what_to_give(cli: Run) -> None:
    _, out, _ = cli(*QWEN, "--restore-rate", "peer=50MB/s", "--format", "json")
    data = json.loads(out)
    assert "break_even" not in data
    assert any("--prefill-rate" in warning for warning in data["warnings"])


def test_a_restore_rate_without_a_name_or_unit_is_refused() -> None:
    with pytest.raises(ArgumentError, match="expected NAME=RATE"):
        restore_rates("dram", None, None, ["50MB/s"])
    with pytest.raises(ArgumentError, match="expected a rate"):
        restore_rates("dram", None, None, ["peer=50"])


@given(
    rate=st.floats(1e5, 1e11),
    prefill_short=st.floats(100, 1e6),
    prefill_long=st.floats(100, 1e6),
    margin=st.one_of(st.just(0.0), st.floats(1e-3, 2.0), st.floats(-0.9, -1e-3)),
)
def test_the_break_even_is_where_restoring_starts_to_win_for_good(
    rate: float, prefill_short: float, prefill_long: float, margin: float
) -> None:
    options = GateOptions(prefill_curve={64: prefill_short, 6400: prefill_long}, margin=margin)
    found = break_even("x", rate, "given", 64, 1 << 20, 6400, options)

    def restore_wins(pages: int) -> bool:
        tokens = pages * 64
        speed = prefill_short + (prefill_long - prefill_short) * (tokens - 64) / (6400 - 64)
        return pages * (1 << 20) / rate <= (1 + margin) * tokens / speed * (1 + 1e-9)

    wins = [restore_wins(k) for k in range(1, 101)]
    if found.tokens is None:
        assert not wins[-1]
    else:
        first = found.tokens // 64
        assert all(wins[first - 1 :]), "restoring wins from the break-even on"
        assert first == 1 or not wins[first - 2], "and not one page before it"
