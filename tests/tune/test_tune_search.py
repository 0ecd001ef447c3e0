"""The search and the decision with hand-made measurements: the budget holds, a confirmed win
is written, a win in one order only or inside the spread is not.

The bench's runner is replaced by a fake that reads each side's profile and answers known
rates on a fake clock: what is tested is tune's own logic, not a measurement (the real runner
is exercised in test_tune_command.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvcr_policy import load_config
from kvcr_policy.tune.run import tune
from kvcr_policy.tune.search import confirm_repeats
from kvcr_policy.tune.setup import TuneSetup
from tests.tune.measured import install

pytestmark = pytest.mark.usefixtures("clean_env")

SETUP = TuneSetup(
    start="throughput",
    geometry="small",
    tokens=256,
    budget_s=200.0,
    only=("batching.read_batch_pages",),
)


def bigger_is_faster(config: Any, order: str) -> float:
    return 1.0 + config.batching.read_batch_pages / 256


def test_the_search_stops_in_time_for_the_confirmation(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = install(monkeypatch, bigger_is_faster)
    outcome = tune(SETUP, clock=fake.clock)
    assert outcome.seconds <= SETUP.budget_s
    trials = [c for c in fake.calls if c.repeat == SETUP.trial_repeat]
    confirm = fake.calls[-1]
    assert len(trials) >= 3 and confirm.repeat >= 3
    assert confirm.profile.endswith("candidate.toml") and confirm.vs == "throughput"
    # Every measurement is a comparison against the start, with tune's own metadata size.
    assert all(c.vs == "throughput" and c.exists_keys == 1 for c in fake.calls)


def test_a_confirmed_win_is_written_with_its_evidence(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = install(monkeypatch, bigger_is_faster)
    target = tmp_path / "site.toml"
    outcome = tune(SETUP, write=target, command="kvcr-policy tune --x", clock=fake.clock)
    assert outcome.verdict is not None and outcome.verdict.wins
    assert outcome.written == target
    text = target.read_text()
    for needle in ("# host: ", "# date: ", "# command: kvcr-policy tune --x", "order tuned, then"):
        assert needle in text
    loaded = load_config(profile=target, dotenv=False)
    assert loaded.config.batching.read_batch_pages == 2048  # the best candidate
    assert loaded.origin("batching.read_batch_pages") == f"profile {target} [batching]"


def test_a_win_in_one_order_only_is_not_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def one_order(config: Any, order: str) -> float:
        return bigger_is_faster(config, order) if order == "P,Q" else 1.0

    fake = install(monkeypatch, one_order)
    target = tmp_path / "site.toml"
    outcome = tune(SETUP, write=target, clock=fake.clock)
    assert outcome.verdict is not None and not outcome.verdict.wins
    assert not target.exists() and outcome.written is None
    assert outcome.message.startswith("'throughput' stands: order base, then tuned: ")


def test_nothing_faster_means_the_start_stands(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = install(monkeypatch, lambda config, order: 5.0)
    outcome = tune(SETUP, write=tmp_path / "site.toml", clock=fake.clock)
    assert "stands" in outcome.message and outcome.written is None


def test_confirm_repeats_fit_what_is_left() -> None:
    setup = TuneSetup(repeat=9, trial_repeat=3)
    assert confirm_repeats(setup, slowest_trial_s=3.0, left_s=100.0) == 9
    assert confirm_repeats(setup, slowest_trial_s=3.0, left_s=5.0) == 5
    assert confirm_repeats(setup, slowest_trial_s=3.0, left_s=0.0) == 3
