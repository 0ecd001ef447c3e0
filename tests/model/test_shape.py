"""One resolution of the geometry options plan, bench and tune share: precedence (preset, then
a config.json, then each option), origins, MLA's one head, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcr_policy.errors import ArgumentError
from kvcr_policy.model.shape import ModelShape, ShapeOptions, resolve_shape
from tests.model.test_hf_config import DEEPSEEK_V3, QWEN3_32B


def test_a_preset_and_the_default_preset() -> None:
    shape = resolve_shape(ShapeOptions(geometry="small"))
    assert (shape.name, shape.layers, shape.heads, shape.page_size) == ("small", 16, 8, 16)
    assert shape.origins["layers"] == "--geometry small"
    default = resolve_shape(ShapeOptions(mla=True), default="qwen3-32b")
    assert (default.name, default.heads, default.mla) == ("qwen3-32b", 1, True)
    assert default.origins["layers"] == "default (--geometry qwen3-32b)"
    assert default.origins["heads"] == "--mla: one latent head"


def test_options_win_over_a_config_which_wins_over_a_preset(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN3_32B))
    given = ShapeOptions(geometry="small", model_config=config, page_size=32, heads=4)
    shape = resolve_shape(given)
    assert shape.name == "Qwen3-32B"
    assert shape.dims() == {"layers": 64, "heads": 4, "head_dim": 128, "dtype": "bfloat16",
                            "page_size": 32, "mla": False}  # fmt: skip
    assert shape.origins["layers"].startswith(f"--model-config {config}: num_hidden_layers, over "
                                              "--geometry small's 16")  # fmt: skip
    assert shape.origins["heads"].startswith("--heads, over --model-config")
    assert shape.origins["page_size"] == "--page-size, over --geometry small's 16"


def test_an_mla_config_needs_only_the_page_size(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(DEEPSEEK_V3))
    shape = resolve_shape(ShapeOptions(model_config=config, page_size=64), default="qwen3-32b")
    pool = shape.pool("layer_first", 128)
    assert (pool.mla, pool.heads, pool.head_dim, pool.layers) == (True, 1, 576, 61)
    assert pool.page_bytes == 64 * 61 * 576 * 2
    with pytest.raises(ArgumentError, match=r"missing: page_size"):
        resolve_shape(ShapeOptions(model_config=config), default="qwen3-32b")


def test_refusals_name_the_option() -> None:
    with pytest.raises(ArgumentError, match=r"missing: heads, head_dim, dtype, page_size"):
        resolve_shape(ShapeOptions(layers=4), default="qwen3-32b")  # no preset behind options
    with pytest.raises(ArgumentError, match="--geometry 'big': expected one of qwen3-32b, small"):
        resolve_shape(ShapeOptions(geometry="big"))
    with pytest.raises(
        ArgumentError,
        match=r"--dtype 'bf17' \(from --dtype, over --geometry small's bfloat16\): expected",
    ):
        resolve_shape(ShapeOptions(geometry="small", dtype="bf17"))
    with pytest.raises(ArgumentError, match=r"--heads 8 with an MLA pool \(from --mla\)"):
        resolve_shape(ShapeOptions(geometry="small", mla=True, heads=8))


def test_recorded_dimensions_make_the_same_shape() -> None:
    shape = resolve_shape(ShapeOptions(geometry="qwen3-32b", mla=True, page_size=32))
    again = ModelShape.from_dims(shape.name, shape.dims())
    assert again == shape
    assert ModelShape.from_dims("small", {}) == resolve_shape(ShapeOptions(geometry="small"))
