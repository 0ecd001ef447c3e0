"""``tune --prefill``: the engine's prefill rate calibrated on this host, written as the gate's
``prefill_curve``, read back by the gate. The rates are injected (``measure``), never this
machine's speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcr_policy.builtin.admission import GateOptions, RestoreGate
from kvcr_policy.config.loading import load_config
from kvcr_policy.registry import Registry
from kvcr_policy.strategies import RestoreOutlook
from kvcr_policy.tune.prefill import LENGTHS, calibrate, write_prefill
from kvcr_policy.tune.setup import TuneError


def per_token(tokens: int) -> float:
    """Injected: a prefill that slows with the prompt (attention's quadratic term), no fixed
    part (a one-token forward costs what its token does)."""
    return 1e-4 * (1 + tokens / 1024)


def test_the_curve_is_tokens_per_second_at_each_length() -> None:
    curve = calibrate(measure=per_token)
    assert list(curve) == list(LENGTHS)
    # 1,024 tokens in 0.2048 s: 1,023 tokens past a one-token forward's 0.1001 ms.
    assert curve[1024] == pytest.approx(1023 / (0.2048 - 1e-4 * (1 + 1 / 1024)), abs=0.1)
    assert curve[64] > curve[4096]


def test_a_forwards_fixed_part_is_not_counted_as_computing_the_prefix() -> None:
    # Every forward costs 5 ms whatever its length, plus 0.1 ms a token: the marginal rate is
    # 10,000 tokens/s at every length, where the whole forward's would be 1,134/s at 64 tokens.
    def with_fixed(tokens: int) -> float:
        return (5e-3 + 1e-4 * tokens) / tokens

    curve = calibrate(measure=with_fixed)
    assert curve == {n: pytest.approx(10_000.0, abs=0.1) for n in LENGTHS}


def test_a_length_no_slower_than_one_token_is_refused() -> None:
    with pytest.raises(TuneError, match="no longer than one of a single token"):
        calibrate((64,), measure=lambda tokens: 1e-3 / tokens)


def test_a_measurement_that_is_not_a_positive_time_is_refused() -> None:
    with pytest.raises(TuneError, match=r"at 1 token measured 0\.0 s a token"):
        calibrate((64,), measure=lambda tokens: 0.0)


def test_the_written_profile_gives_the_gate_its_curve(tmp_path: Path, registry: Registry) -> None:
    path = tmp_path / "prefill.toml"
    text = write_prefill("gated", path, "kvcr-policy tune --prefill", measure=per_token)
    assert path.read_text(encoding="utf-8") == text and "host:" in text
    loaded = load_config(str(path), environ={}, registry=registry).config.admission
    assert loaded.strategy == "gate"
    options = GateOptions.model_validate(loaded.options)
    assert options.prefill_curve == calibrate(measure=per_token)
    # 1,024 tokens compute in 0.2 s at the calibrated ~5,000 tokens/s: a tier that restores
    # 16 pages of 1 MB in 0.16 s is admitted, one that takes 0.32 s is declined.
    gate = RestoreGate(loaded, options)
    assert gate.admit(16, 64, 1_000_000, RestoreOutlook(100e6)).pages == 16
    assert gate.admit(16, 64, 1_000_000, RestoreOutlook(50e6)).pages == 0


def test_a_directory_is_no_output(tmp_path: Path) -> None:
    with pytest.raises(TuneError, match="is a directory"):
        write_prefill("gated", tmp_path, "kvcr-policy tune --prefill", measure=per_token)
