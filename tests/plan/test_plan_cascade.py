"""``kvcr-policy plan --trace --disk-tokens N``: DRAM alone against DRAM + disk on
Mooncake's conversation trace; the rows agree with plain replays of the same capacities, and
bad disk options are refused before any replay."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.commands import run_main
from tests.support.paths import ROOT

pytestmark = pytest.mark.usefixtures("clean_env")

CONVERSATION = str(ROOT / "data" / "traces" / "conversation_trace.jsonl.xz")
Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setenv("COLUMNS", "100")
    return lambda *argv: run_main(capsys, "plan", *argv)


def _json(cli: Run, *argv: str) -> dict[str, Any]:
    code, out, err = cli("--trace", CONVERSATION, "--tp", "8", *argv, "--format", "json")
    assert code == 0, err
    return dict(json.loads(out))


def test_the_disk_level_adds_what_one_tier_of_both_capacities_would_hit(cli: Run) -> None:
    plan = _json(cli, "--capacity-tokens", "1M,3M", "--disk-tokens", "10M",
                 "--disk-limit", "2GB/s", "--link-limit", "20GB/s")  # fmt: skip
    plain = _json(cli, "--capacity-tokens", "1M,3M,10M,11M,13M")
    rates = {r["capacity_tokens"]: r["hit_rate"] for r in plain["evictions"][0]["capacities"]}
    assert plan["disk"] == {"capacity_tokens": 10_000_000, "capacity_from":
                            "--disk-tokens", "gigabytes_per_s": 2.0,
                            "from": "--disk-limit"}  # fmt: skip
    (lru,) = plan["evictions"]
    duration, per_token = plan["trace"]["duration_s"], 32 << 10  # qwen3-32b at tp 8
    for row in lru["cascade"]:
        dram = row["dram_capacity_tokens"]
        assert row["dram_alone_hit_rate"] == rates[dram]
        assert row["cascade_hit_rate"] == rates[dram + 10_000_000]  # no block held twice
        assert row["cascade_hit_rate_at_least"] == rates[10_000_000]  # disk holds DRAM's too
        assert row["dram_alone_hit_rate"] < row["cascade_hit_rate_at_least"]
        disk_bytes = row["disk_hit_tokens"] * per_token
        assert row["disk_restore_bytes_per_s_rank"] == pytest.approx(disk_bytes / duration)
        assert row["disk_limit_share"] == pytest.approx(disk_bytes / duration / 2e9)
        dram_bytes = row["dram_hit_tokens"] * per_token
        assert row["restore_s_rank"] == pytest.approx(dram_bytes / 20e9 + disk_bytes / 2e9)
    code, out, err = cli("--trace", CONVERSATION, "--tp", "8", "--capacity-tokens", "1M",
                         "--disk-tokens", "10M", "--disk-limit", "2GB/s")  # fmt: skip
    assert code == 0, err
    assert "DRAM alone against DRAM + 10M tokens of disk (2 GB/s)" in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--disk-limit", "2GB/s"], "--disk-limit is the rate of --disk-tokens N"),
        (["--disk-tokens", "1M,2M"], "one disk level behind every DRAM capacity"),
        (["--disk-tokens", "lots"], "--disk-tokens: 'lots' is not a token"),
        (["--disk-tokens", "100"], "holds no block of 512 tokens"),
    ],
)
def test_bad_disk_options_are_refused(cli: Run, argv: list[str], expected: str) -> None:
    code, out, err = cli("--trace", CONVERSATION, "--capacity-tokens", "1M", *argv)
    assert code != 0 and expected in " ".join((out + err).split()), out + err


def test_the_disk_options_go_with_a_trace(cli: Run) -> None:
    code, _out, err = cli("--tokens", "1000", "--disk-tokens", "10M")
    assert code == 2 and "--disk-tokens" in err and "go with --trace" in err
