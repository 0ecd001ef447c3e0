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
    """Injected: a prefill that slows with the prompt (attention's quadratic term)."""
    return 1e-4 * (1 + tokens / 1024)


def test_the_curve_is_tokens_per_second_at_each_length() -> None:
    curve = calibrate(measure=per_token)
    assert list(curve) == list(LENGTHS)
    assert curve[1024] == pytest.approx(5000.0)
    assert curve[64] > curve[4096]


def test_a_measurement_that_is_not_a_positive_time_is_refused() -> None:
    with pytest.raises(TuneError, match=r"at 64 tokens measured 0\.0"):
        calibrate((64,), measure=lambda tokens: 0.0)


def test_the_written_profile_gives_the_gate_its_curve(tmp_path: Path, registry: Registry) -> None:
    path = tmp_path / "prefill.toml"
    text = write_prefill("gated", path, "kvcr-policy tune --prefill", measure=per_token)
    assert path.read_text(encoding="utf-8") == text and "host:" in text
    loaded = load_config(str(path), environ={}, registry=registry).config.admission
    assert loaded.strategy == "gate"
    options = GateOptions.model_validate(loaded.options)
    assert options.prefill_curve == calibrate(measure=per_token)
    # 1,024 tokens compute in 0.2 s at the calibrated 5,000 tokens/s: a tier that restores
    # 16 pages of 1 MB in 0.16 s is admitted, one that takes 0.32 s is declined.
    gate = RestoreGate(loaded, options)
    assert gate.admit(16, 64, 1_000_000, RestoreOutlook(100e6)).pages == 16
    assert gate.admit(16, 64, 1_000_000, RestoreOutlook(50e6)).pages == 0


def test_a_directory_is_no_output(tmp_path: Path) -> None:
    with pytest.raises(TuneError, match="is a directory"):
        write_prefill("gated", tmp_path, "kvcr-policy tune --prefill", measure=per_token)
