"""The prefill stand-in of the SGLang replay: seconds per prompt token, measured on this machine.

The SGLang replay runs no model (SGLang's model runner needs a GPU build), so a request's
prefill is charged ``tokens computed x rate``. The rate is measured, once per replay and shared
by both runs: the forward pass of the same tiny Llama the vLLM replay serves
(:data:`~.vllm_model.LLAMA`: hidden 256, 2 layers, 4 heads, 2 KV heads, MLP 512) written
in torch (RMS norm, QKV, causal attention, output projection, SwiGLU MLP; float32, see
:data:`DTYPE_NAME`), over a ``CALIBRATION_TOKENS``-token prompt with one intra-op thread,
median of ``REPEATS``; the rate is that time per token. Attention's quadratic term is folded
into one linear rate at that length.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from .vllm_model import LLAMA

__all__ = ["CALIBRATION_TOKENS", "prefill_seconds_per_token"]

CALIBRATION_TOKENS = 512
REPEATS = 5
#: float32: torch's generic bf16 CPU matmuls were about 50 times slower than float32 on this
#: 2-core machine (and than vLLM's own bf16 kernels), which would make the stand-in a
#: measurement of a slow kernel rather than of a prefill.
DTYPE_NAME = "float32"


def _forward(torch: Any, weights: list[dict[str, Any]], x: Any) -> Any:
    functional = torch.nn.functional
    heads, kv_heads = LLAMA["num_attention_heads"], LLAMA["num_key_value_heads"]
    dim = LLAMA["hidden_size"] // heads
    tokens = x.shape[0]
    for w in weights:
        h = functional.rms_norm(x, (x.shape[-1],))
        q, k, v = (h @ w["qkv"]).split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        q = q.view(tokens, heads, dim).transpose(0, 1)
        k = k.view(tokens, kv_heads, dim).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        v = v.view(tokens, kv_heads, dim).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        attn = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + attn.transpose(0, 1).reshape(tokens, heads * dim) @ w["o"]
        h = functional.rms_norm(x, (x.shape[-1],))
        gate, up = (h @ w["gate_up"]).chunk(2, dim=-1)
        x = x + (functional.silu(gate) * up) @ w["down"]
    return x


def prefill_seconds_per_token(tokens: int = CALIBRATION_TOKENS) -> float:
    """The measured rate (see the module docstring)."""
    import torch

    dtype = getattr(torch, DTYPE_NAME)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        hidden, inner = LLAMA["hidden_size"], LLAMA["intermediate_size"]
        kv = LLAMA["num_key_value_heads"] * hidden // LLAMA["num_attention_heads"]

        def weight(rows: int, cols: int) -> Any:
            return (torch.randn(rows, cols, generator=gen) / rows**0.5).to(dtype)

        weights = [
            {
                "qkv": weight(hidden, hidden + 2 * kv),
                "o": weight(hidden, hidden),
                "gate_up": weight(hidden, 2 * inner),
                "down": weight(inner, hidden),
            }
            for _ in range(LLAMA["num_hidden_layers"])
        ]
        x = torch.randn(tokens, hidden, generator=gen).to(dtype)
        times = []
        with torch.inference_mode():
            _forward(torch, weights, x)  # warm-up
            for _ in range(REPEATS):
                start = time.perf_counter()
                _forward(torch, weights, x)
                times.append(time.perf_counter() - start)
        return statistics.median(times) / tokens
    finally:
        torch.set_num_threads(threads)
