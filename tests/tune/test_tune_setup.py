"""What ``tune`` measures on is recorded in the profile it writes (``[profile.tune]``) and read
back by ``tune --remeasure``: the model's own dimensions and TP size too."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcr_policy.tune.run import _recorded
from kvcr_policy.tune.setup import TuneError, TuneSetup
from kvcr_policy.tune.written import render_profile

DIMS = {"layers": 61, "heads": 1, "head_dim": 576, "dtype": "bfloat16", "page_size": 64}


def test_a_models_dimensions_and_tp_round_trip_through_the_written_profile(
    tmp_path: Path,
) -> None:
    setup = TuneSetup(geometry="DeepSeek-V3", mla=True, scatter=True, tokens=4096, dims=DIMS,
                      tp=8, overrides={"batching.window_batches": "4"})  # fmt: skip
    path = tmp_path / "tuned.toml"
    path.write_text(render_profile(base="throughput", values={}, record=setup.record()))
    again = _recorded(path, TuneSetup())
    assert (again.geometry, again.mla, again.scatter, again.tokens) == ("DeepSeek-V3", True,
                                                                        True, 4096)  # fmt: skip
    assert dict(again.dims or {}) == DIMS and again.tp == 8
    bench = again.bench("p.toml", "throughput", 3)
    assert bench.dims == DIMS and bench.tp == 8 and bench.geometry == "DeepSeek-V3"


def test_a_record_missing_a_dimension_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tuned.toml"
    path.write_text('[profile]\nbase = "throughput"\n\n[profile.tune]\nlayers = 61\n')
    with pytest.raises(TuneError, match="records layers but not heads, head_dim, dtype, page_s"):
        _recorded(path, TuneSetup())
