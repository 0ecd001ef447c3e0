"""Every host pool class of SGLang 0.5.23 built on the CPU with SGLang's own constructors.

Device pools are SGLang's own CPU builds where SGLang allows it; each exception is named in its
builder's docstring. ``host_pool_cases.py`` lists what the backend must do with each class;
this module also reads and writes a page the way SGLang itself does (:func:`page_bytes`,
:func:`fill`), never through kvcr_policy's model of the layout.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace
from typing import Any

from tests.integrations.conftest import mha_pool


def page_size(pool: Any) -> int:
    return int(getattr(pool, "logical_page_size", None) or pool.page_size)


def token_indices(sg: SimpleNamespace, pool: Any, pages: list[int]) -> Any:
    size, torch = page_size(pool), sg.torch
    rows = [torch.arange(p * size, (p + 1) * size, dtype=torch.int64) for p in pages]
    return torch.cat(rows)


def page_bytes(sg: SimpleNamespace, pool: Any, page: int) -> bytes:
    """Page ``page`` as SGLang reads it: ``get_data_page``; for ``page_unified`` (which has
    none) the page block ``kv_buffer[page]``; else the pieces ``get_page_buffer_meta`` lists."""
    torch = sg.torch
    if getattr(pool, "layout", None) == "page_unified":
        return pool.kv_buffer[page].contiguous().view(torch.uint8).numpy().tobytes()
    try:
        data = pool.get_data_page(page * page_size(pool), flat=True)
        return data.contiguous().view(torch.uint8).numpy().tobytes()
    except Exception:
        meta = pool.get_page_buffer_meta(token_indices(sg, pool, [page]))
        return b"".join(ctypes.string_at(int(p), int(n)) for p, n in zip(*meta, strict=True))


def fill(sg: SimpleNamespace, pool: Any, pages: list[int], seed: int) -> None:
    """Random bytes into ``pages``, written the way SGLang writes a page."""
    torch = sg.torch
    generator = torch.Generator().manual_seed(seed)
    for page in pages:
        size = len(page_bytes(sg, pool, page))
        data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=generator)
        if getattr(pool, "layout", None) == "page_unified":
            pool.kv_buffer[page].view(-1).view(torch.uint8).copy_(data)
            continue
        try:
            like = pool.get_data_page(page * page_size(pool), flat=True)
            pool.set_from_flat_data_page(page * page_size(pool), data.view(like.dtype))
        except Exception:
            meta = pool.get_page_buffer_meta(token_indices(sg, pool, [page]))
            blob, at = data.numpy().tobytes(), 0
            for pointer, n in zip(*meta, strict=True):
                ctypes.memmove(int(pointer), blob[at : at + int(n)], int(n))
                at += int(n)


def mha_info(sg: SimpleNamespace, *, v_head_dim: int = 16) -> Any:
    """An MHABufferInfo over CPU "device" K/V tensors (L=3, H=2, D=16, bf16, P=4)."""
    torch = sg.torch
    k = tuple(torch.zeros(8, 2, 16, dtype=torch.bfloat16) for _ in range(3))
    v = tuple(torch.zeros(8, 2, v_head_dim, dtype=torch.bfloat16) for _ in range(3))
    pointers = [torch.tensor([t.data_ptr() for t in side], dtype=torch.uint64) for side in (k, v)]
    return sg.MHABufferInfo(
        buffers=sg.KVBuffers(
            k=k, v=v, k_data_ptrs=pointers[0], v_data_ptrs=pointers[1], layout=sg.KVBufferLayout.NHD
        ),
        page_size=4,
        head_num=2,
        head_dim=16,
        v_head_dim=v_head_dim,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )


def k_only(sg: SimpleNamespace, layout: str) -> Any:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKOnlyPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKOnlyPoolHost

    device = MHATokenToKOnlyPool(64, 4, sg.torch.bfloat16, 2, 16, 3, "cpu", False)
    return MHATokenToKOnlyPoolHost(device, mha_pool(sg, layout), layout, pin_memory=False)


def hisparse(sg: SimpleNamespace, layout: str) -> Any:
    """SGLang's constructor pins its buffer with cudaHostRegister (pin_memory=True, fixed):
    only that registration is skipped here, which has no CUDA to register with."""
    from sglang.srt.mem_cache.pool_host import common
    from sglang.srt.mem_cache.pool_host.mha import HiSparseMHATokenToKVPoolHost

    register = common._cuda_host_register
    common._cuda_host_register = lambda *args, **kwargs: None
    try:
        return HiSparseMHATokenToKVPoolHost(
            mha_info(sg), 6.0, 4, device_capacity_tokens=8, start_layer=0, end_layer=3
        )
    finally:
        common._cuda_host_register = register


def mxfp8(sg: SimpleNamespace, layout: str) -> Any:
    """SGLang refuses to build it without CUDA (its staged write-back kernel and the interleaved
    scale layout need a GPU): the class's own methods are asked on an instance made without
    running its constructor, with the attributes every MHA host pool has."""
    from sglang.srt.mem_cache.pool_host.mha_mxfp8 import MHATokenToKVPoolMXFP8Host

    donor = mha_pool(sg, layout)
    pool = object.__new__(MHATokenToKVPoolMXFP8Host)
    pool.__dict__.update(donor.__dict__)
    return pool


def mla_dsa(sg: SimpleNamespace, layout: str, *, indexer: bool) -> Any:
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost, make_dsa_indexer_pool_decl
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0):
        device = DSATokenToKVPool(64, 64, 32, sg.torch.bfloat16, 16, 2, "cpu", 128, False, 48)
    info = device.get_device_pool_infos()[0].buffer_info
    anchor = sg.MLATokenToKVPoolHost(
        info,
        8.0,
        0,
        64,
        layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=64,
        start_layer=0,
        end_layer=2,
        target_layer_num=2,
    )
    if not indexer:
        return anchor
    return DSAIndexerPoolHost(make_dsa_indexer_pool_decl(device), anchor, pin_memory=False)


def qsa(sg: SimpleNamespace, layout: str) -> Any:
    """The device side is a stand-in: QSAIndexerPoolHost reads only ``qsa_compress_ratio`` and
    ``qsa_compressed_k_buffer_pool`` of its QSATokenToKVPool (a hybrid Mamba device pool)."""
    from sglang.srt.mem_cache.pool_host.qsa import QSAIndexerPoolHost

    buffers = [sg.torch.zeros(16, 1, 8, dtype=sg.torch.bfloat16) for _ in range(2)]
    device = SimpleNamespace(qsa_compress_ratio=2, qsa_compressed_k_buffer_pool=buffers)
    return QSAIndexerPoolHost(device, mha_pool(sg, layout))


def dsv4_paged(sg: SimpleNamespace, layout: str) -> Any:
    from sglang.srt.mem_cache.memory_pool_host import DeepSeekV4PagedHostPool

    device = [sg.torch.zeros(8, 2, 24, dtype=sg.torch.uint8) for _ in range(3)]
    return DeepSeekV4PagedHostPool("c4", device, 96, 32, 4, layout=layout, pin_memory=False)


def dsv4_state(sg: SimpleNamespace, layout: str) -> Any:
    from sglang.srt.mem_cache.deepseek_v4_compress_state import CompressStatePool
    from sglang.srt.mem_cache.memory_pool_host import DeepSeekV4StateHostPool

    states = [
        CompressStatePool(64, 8, False, 16, sg.torch.float32, "cpu", False, 4, swa_page_size=4)
        for _ in range(2)
    ]
    return DeepSeekV4StateHostPool("c4_state", states, 16, 4, layout=layout, pin_memory=False)


def logical(sg: SimpleNamespace, layout: str) -> Any:
    from sglang.srt.mem_cache.memory_pool_host import LogicalHostPool

    return LogicalHostPool(64, 4, layout)


def page_rows(sg: SimpleNamespace, row_bytes: int) -> Any:
    from sglang.srt.mem_cache.device_pool_info import PageRowBufferInfo

    slab = sg.torch.zeros(3, 8, row_bytes, dtype=sg.torch.uint8)
    rows = tuple(slab[i] for i in range(3))
    return PageRowBufferInfo(slab=slab, rows=rows, row_bytes=row_bytes, page_size=4, num_pages=8)


def minimax_main(sg: SimpleNamespace, layout: str) -> Any:
    from sglang.srt.mem_cache.pool_host.minimax_m3_nvfp4 import MiniMaxM3Nvfp4MainKVPoolHost

    return MiniMaxM3Nvfp4MainKVPoolHost(
        page_rows(sg, 64),
        4.0,
        0,
        4,
        layout,
        pin_memory=False,
        device_capacity_tokens=32,
        start_layer=0,
        end_layer=3,
    )


def minimax_index(sg: SimpleNamespace, layout: str) -> Any:
    from sglang.srt.mem_cache.pool_host.minimax_m3_nvfp4 import MiniMaxM3Nvfp4IndexKPoolHost

    main = minimax_main(sg, layout)
    return MiniMaxM3Nvfp4IndexKPoolHost(
        page_rows(sg, 32), main, layout, pin_memory=False, start_layer=0, end_layer=3
    )


def envelope(sg: SimpleNamespace, layout: str) -> Any:
    from sglang.srt.mem_cache.pool_host.unified import UnifiedPageEnvelopeHostPool
    from sglang.srt.mem_cache.unified_memory_pool import (
        MHASubPoolSpec,
        UnifiedKVPool,
        UnifiedMHATokenToKVPool,
    )

    specs = [
        MHASubPoolSpec(
            name=name,
            layer_num=2,
            grow_direction=direction,
            head_num=2,
            head_dim=16,
            store_dtype=sg.torch.bfloat16,
        )
        for name, direction in (("full", "up"), ("swa", "down"))
    ]
    unified = UnifiedKVPool(
        total_bytes=1 << 20,
        sub_pool_specs=specs,
        device="cpu",
        enable_memory_saver=False,
        page_size=4,
    )
    device = UnifiedMHATokenToKVPool(unified_buffer=unified, sub_pool_name="full", page_size=4)
    return UnifiedPageEnvelopeHostPool(device, 2.0, 0, 4, layout, pin_memory=False)


def interleave(sg: SimpleNamespace, layout: str) -> Any:
    from sglang.srt.mem_cache.page_interleave import PageInterleavePlacement, PageShardSpec
    from sglang.srt.mem_cache.pool_host.page_interleave import PageInterleaveHostPool

    spec = PageShardSpec(
        shard_rank=0, shard_size=2, page_size=4, max_prefix_tokens=16, chunk_tokens=16
    )
    return PageInterleaveHostPool(mha_pool(sg, layout), PageInterleavePlacement(spec))


def mamba(sg: SimpleNamespace, layout: str) -> Any:
    torch = sg.torch
    info = sg.MambaStateBufferInfo(
        temporal=torch.zeros(2, 4, 3, 5, dtype=torch.float32),
        conv=(torch.zeros(2, 4, 6, dtype=torch.float32),),
    )
    return sg.MambaPoolHost(
        info, 4.0, 0, device_capacity=4, pin_memory=False, device="cpu", layout=layout
    )
