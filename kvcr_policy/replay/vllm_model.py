"""The model the vLLM replay serves: a tiny Llama built locally, with dummy weights.

No download: the command writes the model's ``config.json`` into a fresh folder and vLLM
builds the model from it with ``load_format="dummy"`` (seeded random weights) and no tokenizer;
prompts are token ids. Greedy outputs of random weights are as deterministic as any, so they
still tell whether the KV a request ran on was the KV it would have computed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

__all__ = ["BLOCK_BYTES", "BLOCK_SIZE", "LLAMA", "VOCAB", "write_model"]

#: The model, as the replay writes it (hidden 256, 2 layers, 4 heads, 2 KV heads, bf16).
LLAMA: Final[dict[str, Any]] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
}
VOCAB: Final = int(LLAMA["vocab_size"])
#: vLLM's CPU attention backend takes block sizes that are multiples of 32.
BLOCK_SIZE: Final = 32
_HEAD_DIM = LLAMA["hidden_size"] // LLAMA["num_attention_heads"]
#: Bytes of one block of every layer's K and V (bf16).
BLOCK_BYTES: Final = (
    LLAMA["num_hidden_layers"] * 2 * BLOCK_SIZE * LLAMA["num_key_value_heads"] * _HEAD_DIM * 2
)


def write_model(folder: Path) -> Path:
    """Write the model's ``config.json`` into ``folder``; the folder is the model."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(LLAMA, indent=1), encoding="utf-8")
    return folder
