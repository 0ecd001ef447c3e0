"""vLLM's paged KV cache as one kvcr_policy pool, without a copy.

vLLM 0.32 allocates the KV cache of all the layers of a group as one tensor and hands each
layer a view ``(num_blocks, *block)`` into it, one layer after another
(``KVCacheTensor.layer_stride``); measured on the CPU backend, a Llama layer is
``(num_blocks, 2, block_size, kv_heads * head_size)``: K and V of one block are one contiguous
piece of ``block_bytes``. So block ``b`` of layer ``l`` starts at ``l * layer_stride +
b * block_bytes``: exactly the ``layer_first`` one-fragment-per-layer layout of
:class:`~kvcr_policy.geometry.PoolGeometry` (the one SGLang's MLA host pool has), with a page
of ``block_size`` tokens whose "head" is the block's bytes per token. The pool is registered as
that view of vLLM's own memory: pages move between the tier and vLLM's blocks directly (one
memory copy each way; the ``cuda`` transport on a GPU). Inside a block the bytes are never
interpreted, so MHA and MLA blocks are alike.

Layers that are not one such run of equal, back-to-back views (another allocator, a
``(2, num_blocks, ...)`` K/V-first layout) are refused with what was found.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from ...errors import PoolError
from ...geometry import PoolGeometry

__all__ = ["KVPool", "pool_of", "scheduler_geometry"]

POOL = "kv"


@dataclass(frozen=True, slots=True)
class KVPool:
    """vLLM's KV cache as a pool: its geometry and the tensor view registered with it."""

    geometry: PoolGeometry
    buffer: Any
    block_bytes: int  # bytes of one block of one layer


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def pool_of(kv_caches: dict[str, Any], block_size: int) -> KVPool:
    """The pool over ``kv_caches`` (layer name -> tensor, as ``register_kv_caches`` gets them)."""
    import torch

    if not kv_caches:
        raise PoolError("vLLM registered no KV cache tensors: nothing to store")
    layers = sorted(kv_caches.values(), key=lambda t: t.data_ptr())
    first = layers[0]
    shapes = {tuple(t.shape) for t in layers}
    problem = ""
    if len(shapes) != 1 or len({t.dtype for t in layers}) != 1:
        problem = f"layers of different shapes or dtypes ({sorted(shapes)})"
    elif not all(t.is_contiguous() for t in layers):
        problem = "a layer view that is not contiguous (a K/V-first layout?)"
    num_blocks = int(first.shape[0])
    block_elems = first[0].numel() if first.dim() > 1 else 0
    block_bytes = block_elems * first.element_size()
    if not problem and (block_elems == 0 or block_elems % block_size):
        problem = f"a block of {block_elems} elements, not a multiple of block_size {block_size}"
    plane = num_blocks * block_bytes
    gaps = {b.data_ptr() - a.data_ptr() for a, b in pairwise(layers)}
    same = {t.untyped_storage().data_ptr() for t in layers}
    if not problem and (len(same) != 1 or gaps - {plane}):
        problem = f"layers that are not back to back in one allocation (gaps {sorted(gaps)})"
    if problem:
        message = (
            f"vLLM's KV cache ({len(layers)} layers, shape {tuple(first.shape)}, "
            f"{first.dtype}) has {problem}; kvcr_policy registers vLLM's blocks in place when "
            "every layer is a (num_blocks, ...) view of one allocation, one after another, as "
            "vLLM 0.32 allocates them"
        )
        raise PoolError(message)
    width = block_elems // block_size
    geometry = PoolGeometry(
        name=POOL,
        layout="layer_first",
        layers=len(layers),
        heads=1,
        head_dim=width,
        dtype=_dtype_name(first.dtype),
        page_size=block_size,
        tokens=num_blocks * block_size,
        mla=True,
        device=str(first.device),
    )
    view = torch.as_strided(
        first,
        (len(layers), num_blocks * block_size, 1, width),
        (num_blocks * block_elems, width, width, 1),
        first.storage_offset(),
    )
    return KVPool(geometry, view, block_bytes)


def scheduler_geometry(kv_cache_config: Any, block_size: int) -> PoolGeometry:
    """The pool geometry the workers will register, from vLLM's ``KVCacheConfig`` alone, with
    one page of tokens: what a scheduler in its own process attaches to ask the tier (a peer
    tier is matched by pool name and page layout, never by its token count)."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        message = f"vLLM's KV cache has {len(groups)} groups; kvcr_policy stores one"
        raise PoolError(message)
    spec = groups[0].kv_cache_spec
    itemsize = _itemsize(spec.dtype)
    width = int(spec.page_size_bytes) // itemsize // block_size
    return PoolGeometry(
        name=POOL,
        layout="layer_first",
        layers=len(groups[0].layer_names),
        heads=1,
        head_dim=width,
        dtype=_dtype_name(spec.dtype),
        page_size=block_size,
        tokens=block_size,
        mla=True,
    )


def _itemsize(dtype: Any) -> int:
    import torch

    return int(torch.empty(0, dtype=dtype).element_size())
