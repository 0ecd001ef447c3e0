"""A model's KV dimensions from its Hugging Face config.json, read as SGLang reads them.

The configs below carry the fields of the published ones (Qwen3-32B, DeepSeek-V3, Llama-2-7B,
a multimodal model's ``text_config``); every other field of those files is left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy.errors import ArgumentError
from kvcr_policy.model.hf_config import MAX_CONFIG_BYTES, read_model_config

QWEN3_32B = {
    "_name_or_path": "Qwen/Qwen3-32B", "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3", "num_hidden_layers": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120, "torch_dtype": "bfloat16",
}  # fmt: skip
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "hidden_size": 7168, "num_nextn_predict_layers": 1, "torch_dtype": "bfloat16",
}  # fmt: skip
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": None, "hidden_size": 4096, "torch_dtype": "float16",
}  # fmt: skip


def written(tmp_path: Path, config: Any, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def values(found: dict[str, tuple[Any, str]]) -> dict[str, Any]:
    return {key: value for key, (value, _) in found.items()}


def test_gqa_heads_come_from_the_kv_heads(tmp_path: Path) -> None:
    name, found = read_model_config(written(tmp_path, QWEN3_32B))
    assert name == "Qwen3-32B"
    assert values(found) == {"layers": 64, "heads": 8, "head_dim": 128, "mla": False,
                             "dtype": "bfloat16"}  # fmt: skip
    assert found["heads"][1].endswith("config.json: num_key_value_heads")


def test_mla_is_one_latent_head_of_the_lora_rank_and_the_rope_dims(tmp_path: Path) -> None:
    name, found = read_model_config(written(tmp_path, DEEPSEEK_V3))
    assert name == "DeepseekV3ForCausalLM"
    # 61 layers: the multi-token-prediction layer holds no page of the main pool.
    assert values(found) == {"layers": 61, "heads": 1, "head_dim": 576, "mla": True,
                             "dtype": "bfloat16"}  # fmt: skip
    assert "kv_lora_rank 512 + qk_rope_head_dim 64" in found["head_dim"][1]


def test_plain_mha_without_head_dim_divides_the_hidden_size(tmp_path: Path) -> None:
    _, found = read_model_config(written(tmp_path, LLAMA2_7B))
    assert values(found) == {"layers": 32, "heads": 32, "head_dim": 128, "mla": False,
                             "dtype": "float16"}  # fmt: skip
    assert "num_attention_heads (no GQA)" in found["heads"][1]
    assert "hidden_size / num_attention_heads" in found["head_dim"][1]


def test_a_multimodal_config_is_read_from_its_text_config(tmp_path: Path) -> None:
    config = {"model_type": "qwen2_5_vl", "torch_dtype": "bfloat16",
              "text_config": {"num_hidden_layers": 28, "num_attention_heads": 28,
                              "num_key_value_heads": 4, "hidden_size": 3584}}  # fmt: skip
    name, found = read_model_config(written(tmp_path, config))
    assert name == "qwen2_5_vl"
    assert values(found) == {"layers": 28, "heads": 4, "head_dim": 128, "mla": False,
                             "dtype": "bfloat16"}  # fmt: skip
    assert found["layers"][1].endswith("text_config.num_hidden_layers")


def test_a_config_without_a_dtype_leaves_it_to_the_command_line(tmp_path: Path) -> None:
    config = {key: value for key, value in QWEN3_32B.items() if key != "torch_dtype"}
    _, found = read_model_config(written(tmp_path, {**config, "dtype": "torch.float16"}))
    assert found["dtype"][0] == "float16"
    _, found = read_model_config(written(tmp_path, config))
    assert "dtype" not in found


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("{", "not JSON"),
        ("[1, 2]", "expected a JSON object (a model's config.json), got a list"),
        (json.dumps({"num_attention_heads": 8}), "has no num_hidden_layers"),
        (json.dumps({**QWEN3_32B, "num_hidden_layers": "64"}), "num_hidden_layers = '64'"),
        (json.dumps({**QWEN3_32B, "num_key_value_heads": 0}), "expected a positive integer"),
        (json.dumps({**QWEN3_32B, "torch_dtype": "int4"}), "'int4' is not a KV dtype"),
        (json.dumps({"num_hidden_layers": 2, "hidden_size": 10}), "give --heads"),
        (json.dumps({"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 10}),
         "not a multiple of num_attention_heads 3; give --head-dim"),
    ],
)  # fmt: skip
def test_what_is_not_a_decoders_config_is_refused_by_name(
    tmp_path: Path, content: str, expected: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ArgumentError, match=r"--model-config .*config\.json: ") as refused:
        read_model_config(path)
    assert expected in str(refused.value)


def test_a_path_that_is_no_config_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ArgumentError, match=r"no such file; give the model's config\.json"):
        read_model_config(tmp_path / "absent.json")
    with pytest.raises(ArgumentError, match=r"is a directory; give the config\.json inside it"):
        read_model_config(tmp_path)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ArgumentError, match=r"not a model's config\.json"):
        read_model_config(big)
