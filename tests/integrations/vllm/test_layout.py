"""vLLM's KV cache registered in place: a page of the pool is exactly one block of each layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.errors import PoolError
from kvcr_policy.integrations.vllm.layout import POOL, pool_of

BLOCKS, BLOCK, WIDTH, LAYERS = 8, 32, 16, 3


def vllm_caches() -> dict[str, torch.Tensor]:
    """As vLLM 0.32 allocates them on the CPU: one tensor, a (blocks, 2, block, width) view per
    layer, one after another (measured: KVCacheTensor.layer_stride)."""
    whole = torch.arange(LAYERS * BLOCKS * 2 * BLOCK * WIDTH, dtype=torch.int32).to(torch.bfloat16)
    layers = whole.view(LAYERS, BLOCKS, 2, BLOCK, WIDTH)
    return {f"model.layers.{i}.self_attn.attn": layers[i] for i in range(LAYERS)}


def test_each_page_is_one_block_of_every_layer() -> None:
    caches = vllm_caches()
    pool = pool_of(caches, BLOCK)
    assert pool.geometry.layers == LAYERS and pool.geometry.tokens == BLOCKS * BLOCK
    assert pool.block_bytes == 2 * BLOCK * WIDTH * 2
    layers = list(caches.values())
    for layer in range(LAYERS):
        for block in range(BLOCKS):
            page = pool.buffer[layer, block * BLOCK : (block + 1) * BLOCK]
            assert torch.equal(page.reshape(-1), layers[layer][block].reshape(-1))


def test_pages_move_between_blocks_through_a_pipeline() -> None:
    caches = vllm_caches()
    pool = pool_of(caches, BLOCK)
    layers = list(caches.values())
    before = [layer[2].clone() for layer in layers]
    loaded = load_config(overrides={"placement.capacity_bytes": "16MiB"})
    with build_pipeline(loaded) as pipeline:
        pipeline.register_pool(POOL, pool.geometry, pool.buffer)
        assert pipeline.set(["k"], np.arange(2 * BLOCK, 3 * BLOCK), POOL) == [True]
        assert pipeline.get(["k"], np.arange(5 * BLOCK, 6 * BLOCK), POOL) == [True]
    for layer, old in zip(layers, before, strict=True):
        assert torch.equal(layer[5], old)


def test_layers_in_separate_allocations_are_refused_with_what_was_found() -> None:
    caches = {f"l{i}": torch.zeros(BLOCKS, 2, BLOCK, WIDTH, dtype=torch.bfloat16) for i in range(2)}
    with pytest.raises(PoolError, match="not back to back in one allocation"):
        pool_of(caches, BLOCK)


def test_a_kv_first_layout_is_refused() -> None:
    whole = torch.zeros(2, BLOCKS, BLOCK, WIDTH, dtype=torch.bfloat16)
    with pytest.raises(PoolError, match="not contiguous"):
        pool_of({"l0": whole.transpose(0, 1)}, BLOCK)
