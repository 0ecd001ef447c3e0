"""The SGLang stack the replay drives on the CPU, one per tensor-parallel rank: a gloo group of
the ranks, a CPU device pool (``MHATokenToKVPool``, one KV head per rank, or an MLA model's
``MLATokenToKVPool``) with its paged allocator, the matching real host pool
(``MHATokenToKVPoolHost`` / ``MLATokenToKVPoolHost``, ``layer_first``) and SGLang's
``HiCacheController`` with our backend as its storage (or none: the run without an L3 tier),
and the bytes of every page.

What is SGLang's own: the controller with its prefetch, prefetch-I/O and backup threads, their
queues and acks, its page get and set functions (``interface_v1``), its storage hit query and
key hashing (``get_storage_hash_str``), its device and host pools, and our backend built by
SGLang's factory from the ``dynamic`` extra config. What is not, and why: the device-host copy
kernel ``sgl_kernel.kvcacheio.transfer_kv_direct``, which SGLang imports only on CUDA, ROCm and
XPU builds; a torch index copy with the same arguments stands in (:func:`transfer_kv_direct`).
"""

from __future__ import annotations

import tempfile
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = [
    "DEVICE_TOKENS",
    "HOST_TOKENS",
    "LAYERS",
    "PAGE",
    "build_stack",
    "device_planes",
    "page_kv",
]

# MHA: one KV head of 8 per rank (bf16: 4 KiB a page of 2 layers); MLA: one latent head of 16
# (kv_lora_rank 12 + rope 4), the same on every rank (4 KiB a page too, K only).
LAYERS, HEADS, HEAD_DIM, PAGE = 2, 1, 8, 64
MLA_LORA, MLA_ROPE = 12, 4
DEVICE_TOKENS = 2048  # the device pool: 32 pages
HOST_TOKENS = 128 * 512  # the host pool: 1024 pages (4 MiB), below the trace's working set
HOST_BUDGET = 1 << 30


def transfer_kv_direct(
    src_layers: Any, dst_layers: Any, src_indices: Any, dst_indices: Any, page_size: int
) -> None:
    """Stand-in for ``sgl_kernel.kvcacheio.transfer_kv_direct`` (absent on CPU builds)."""
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)]


def page_kv(key: str, rank: int = 0, mla: bool = False) -> np.ndarray:
    """The KV bits of the page with ``key`` on ``rank``, as a prefill would compute them (a
    function of the prefix the key names): int16 ``(planes, layers, page, heads, dim)``; MHA has
    K and V of the rank's own head, MLA one latent plane, the same on every rank."""
    seed = int(key[:16], 16) if mla else int(key[:16], 16) ^ (rank * 0x9E3779B97F4A7C15)
    shape = (1, LAYERS, PAGE, 1, MLA_LORA + MLA_ROPE) if mla else (2, LAYERS, PAGE, HEADS, HEAD_DIM)
    return np.random.default_rng(seed).integers(-(2**15), 2**15, shape, dtype=np.int16)


def device_planes(device: Any) -> list[list[Any]]:
    """The device pool's per-layer tensors, plane by plane (MHA: K, V; MLA: the latent)."""
    if hasattr(device, "k_buffer"):
        return [list(device.k_buffer), list(device.v_buffer)]
    return [list(device.kv_buffer)]


def build_stack(
    extra: dict[str, Any] | None,
    rank: int = 0,
    ranks: int = 1,
    mla: bool = False,
    rendezvous: str | None = None,
) -> SimpleNamespace:
    """torch, SGLang's key hashing, the device pool, its allocator, the host pool and the
    controller of one rank; ``extra``: our backend's extra config, or None for no storage;
    ``rendezvous``: the gloo file store shared by the ranks."""
    import torch
    import torch.distributed as dist

    from ..bench.torchvision_stub import stub_torchvision

    torch.set_num_threads(1)
    stub_torchvision()
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host import mha
    from sglang.srt.mem_cache.pool_host import mla as mla_host
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    from sglang.srt.runtime_context import get_parallel

    # The one stand-in: no CPU kernel exists.
    mha.transfer_kv_direct = mla_host.transfer_kv_direct = transfer_kv_direct
    store = rendezvous or f"{tempfile.mkdtemp(prefix='kvcr-replay-')}/store"
    dist.init_process_group("gloo", init_method=f"file://{store}", world_size=ranks, rank=rank)
    get_parallel().override_permanently(
        tp_rank=rank, tp_size=ranks, pp_rank=0, pp_size=1, attn_dcp_size=1, attn_dcp_rank=0
    )
    dtype = torch.bfloat16
    device: Any
    if mla:
        device = MLATokenToKVPool(
            DEVICE_TOKENS, PAGE, dtype, MLA_LORA, MLA_ROPE, LAYERS, "cpu", False
        )
    else:
        device = MHATokenToKVPool(DEVICE_TOKENS, PAGE, dtype, HEADS, HEAD_DIM, LAYERS, "cpu", False)
    allocator = PagedTokenToKVPoolAllocator(DEVICE_TOKENS, PAGE, dtype, "cpu", device, False)
    info = device.get_device_pool_infos()[0].buffer_info
    sizes: dict[str, Any] = dict(
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=DEVICE_TOKENS,
        start_layer=0,
        end_layer=LAYERS,
        host_token_capacity=HOST_TOKENS,
    )
    host: Any
    with host_memory_budget_scope(HOST_BUDGET):  # a few MiB: SGLang's 10 GiB reserve aside
        if mla:
            host = MLATokenToKVPoolHost(
                info, 1.0, 0, PAGE, "layer_first", target_layer_num=LAYERS, **sizes
            )
        else:
            host = MHATokenToKVPoolHost(info, 1.0, 0, PAGE, "layer_first", **sizes)
    storage: dict[str, Any] = {}
    if extra is not None:
        storage = dict(
            storage_backend="dynamic",
            storage_backend_extra_config=extra,
            prefetch_threshold=PAGE,
            model_name="kvcr-replay",
            enable_storage_metrics=True,
        )
    controller = HiCacheController(
        allocator,
        host,
        PAGE,
        dist.group.WORLD,
        threading.Event(),
        write_policy="write_through",
        io_backend="direct",
        **storage,
    )
    return SimpleNamespace(
        torch=torch,
        hash=get_storage_hash_str,
        device=device,
        allocator=allocator,
        host=host,
        controller=controller,
    )
