"""``kvcr-policy bench --metrics``: /metrics over HTTP after a real run, held up for a scrape.

The bytes restored equal the JSON's ``bytes`` times its ``runs``; descriptors before and after
coalescing and the link-limit gauge are there; ``--vs-set`` changes Q only (here: Q records no
metrics, so only P's restores are counted).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.observability.scraping import Samples, read_samples, value
from tests.support.paths import child_env
from tests.support.processes import next_line

SMALL = ["--geometry", "small", "--tokens", "1024", "--repeat", "1", "--format", "json"]


@contextmanager
def bench(*args: str) -> Iterator[tuple[dict[str, Any], str]]:
    """A bench run with ``--metrics 0`` (loopback, a free port), held up until the block
    ends: (its JSON result, its /metrics URL)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvcr_policy", "bench", *SMALL, "--metrics", "0",
         "--metrics-hold", "120", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(drop=("KVCR_POLICY_",)),
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = next_line(proc, stream="stderr")
        assert first.startswith("metrics: http://127.0.0.1:"), first
        url = first.split()[1]
        lines = []
        for line in proc.stdout:  # the figures are printed, then /metrics is held up
            lines.append(line)
            if line.rstrip() == "}":
                break
        yield json.loads("".join(lines)), url
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0  # SIGTERM ends the hold cleanly


def _restored(samples: Samples) -> float:
    return value(samples, "kvcr_policy_bytes_total", direction="restore")


def test_a_scrape_after_the_run_shows_what_it_restored() -> None:
    with bench("--profile", "throughput", "--vs", "default") as (result, url):
        s = read_samples(url)
        with urllib.request.urlopen(url, timeout=10) as reply:
            page = reply.read().decode()
    assert _restored(s) == result["bytes"] * len(result["runs"])
    for profile in ("throughput", "default"):
        mine = read_samples_of(s, profile)
        assert _restored(mine) == result["bytes"] * len(result["runs"]) / 2
    before = value(
        read_samples_of(s, "throughput"), "kvcr_policy_descriptors_before_coalescing_total"
    )
    after = value(
        read_samples_of(s, "throughput"), "kvcr_policy_descriptors_after_coalescing_total"
    )
    assert before > after > 0  # throughput coalesces; default sends one per fragment
    plain = read_samples_of(s, "default")
    assert value(plain, "kvcr_policy_descriptors_before_coalescing_total") == value(
        plain, "kvcr_policy_descriptors_after_coalescing_total"
    )
    # The limit is measured with P's pipeline before every restore.
    assert value(read_samples_of(s, "throughput"), "kvcr_policy_link_limit_bytes_per_second") > 0
    # Every pipeline closed: their tiers' level series are gone, not left at 0.
    assert not [k for k in s if k[0] in ("kvcr_policy_tier_capacity_bytes",
                                         "kvcr_policy_tier_used_bytes")]  # fmt: skip
    for profile in ("throughput", "default"):
        # The metadata test's one-byte pages stay out of the page counters: bytes per page
        # stored = bytes per page restored = the benchmark's page.
        mine = read_samples_of(s, profile)
        per_page = {
            d: value(mine, "kvcr_policy_bytes_total", direction=d)
            / value(mine, "kvcr_policy_pages_total", direction=d)
            for d in ("store", "restore")
        }
        assert per_page["store"] == per_page["restore"], (profile, per_page)
        assert value(mine, "kvcr_policy_metadata_keys_queried_total") == 0  # no exists measured
    assert "_created" not in page
    assert "kvcr_policy_build_info{" in page


def read_samples_of(samples: Samples, profile: str) -> Samples:
    """The samples of one profile label (``read_samples`` keeps the label when not asked)."""
    return {
        (name, tuple(kv for kv in labels if kv[0] != "profile")): v
        for (name, labels), v in samples.items()
        if ("profile", profile) in labels
    }


def test_vs_set_changes_q_only() -> None:
    args = ["--profile", "throughput", "--vs", "throughput", "--vs-set",
            "observability.metrics=false"]  # fmt: skip
    with bench(*args) as (result, url):
        s = read_samples(url, "throughput")
    # Q had metrics off: only P's restores (half of the runs) were recorded.
    assert _restored(s) == result["bytes"] * len(result["runs"]) / 2
    assert {r["profile"] for r in result["runs"]} == {"throughput"}


def test_a_bad_metrics_address_exits_2_before_the_run() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvcr_policy", "bench", *SMALL, "--metrics", "host:port"],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
        check=False,
    )
    assert done.returncode == 2
    assert "--metrics: expected PORT, HOST:PORT" in done.stderr
    assert done.stdout == ""


def test_the_hold_catches_sigterm_before_the_figures_are_printed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader that sends SIGTERM as soon as it has read the figures must find the hold's
    handler in place: it is installed before the figures are printed, not after (the run and
    the report are replaced here; the order is what is checked)."""
    from kvcr_policy.bench import command

    seen: list[Any] = []
    monkeypatch.setattr(command, "run_plan", lambda plan, say: object())
    monkeypatch.setattr(
        command, "_report", lambda *args: seen.append(signal.getsignal(signal.SIGTERM))
    )
    before = signal.getsignal(signal.SIGTERM)
    command.run(command.BenchCommand(metrics="0", metrics_hold=0, json=True))
    assert len(seen) == 1 and seen[0] not in (signal.SIG_DFL, before)
    assert signal.getsignal(signal.SIGTERM) is before
