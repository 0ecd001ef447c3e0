"""The SGLang stack the controller replay drives, built on the CPU (see ``controller_replay``):
a gloo group of one rank, a CPU ``MHATokenToKVPool`` with its paged allocator, a real
``MHATokenToKVPoolHost`` and SGLang's ``HiCacheController`` with our backend as its storage, and
the trace's pages: token ids per block id, bytes per page key.

What is SGLang's own: the controller with its prefetch, prefetch-I/O, prefetch-sync and backup
threads, their queues and acks, its page get and set functions (``_page_get_zero_copy`` /
``_page_set_zero_copy``: ``interface_v1``), its storage hit query and key hashing
(``get_storage_hash_str``), its L2 transfer engine, a gloo process group of one rank, a CPU
device KV pool (``MHATokenToKVPool``) with its paged allocator, a real ``MHATokenToKVPoolHost``
(``layer_first``, ``io_backend="direct"``), and our backend built by SGLang's factory from the
``dynamic`` extra_config.
"""

from __future__ import annotations

import gzip
import json
import lzma
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

#: The Mooncake conversation trace the repository bundles (data/traces/README.md).
TRACE = Path(__file__).resolve().parents[3] / "data" / "traces" / "conversation_trace.jsonl.xz"
BLOCK = 512  # tokens per block id of the trace
LAYERS, HEADS, HEAD_DIM, PAGE = 2, 1, 8, 64  # bf16: 64 bytes a token, 4 KiB a page
DEVICE_TOKENS = 4 * BLOCK  # the write-through chunk: 4 blocks at a time
HOST_BLOCKS = 128  # host pool: 128 blocks (4 MiB), far below the trace's working set


def read_requests(path: Path, count: int) -> list[dict[str, Any]]:
    """The first ``count`` requests of a trace of one JSON object per line; a ``.xz`` or
    ``.gz`` file is read through Python's lzma or gzip, as ``kvcr-policy plan --trace`` does."""
    opener: Any = {".xz": lzma.open, ".gz": gzip.open}.get(path.suffix, open)
    with opener(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for _, line in zip(range(count), lines, strict=False)]


def transfer_kv_direct(
    src_layers: Any, dst_layers: Any, src_indices: Any, dst_indices: Any, page_size: int
) -> None:
    """Stand-in for ``sgl_kernel.kvcacheio.transfer_kv_direct`` (absent on CPU builds): copy
    the token rows ``src_indices`` of each source layer to rows ``dst_indices`` of its
    destination layer."""
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)]


def block_tokens(block: int) -> list[int]:
    return [(block * BLOCK + i) % 2_000_000_000 for i in range(BLOCK)]


def page_kv(key: str) -> np.ndarray:
    """The K and V bits of the page with ``key``: int16 ``(2, layers, page, heads, dim)``."""
    rng = np.random.default_rng(int(key[:16], 16))
    return rng.integers(-(2**15), 2**15, (2, LAYERS, PAGE, HEADS, HEAD_DIM), dtype=np.int16)


def build_stack(overrides: dict[str, Any], profile: str | None) -> SimpleNamespace:
    """torch, SGLang's key hashing, the device pool, its allocator, the host pool, and the
    controller with our backend on the tier ``overrides`` name."""
    import torch
    import torch.distributed as dist

    from kvcr_policy.bench.torchvision_stub import stub_torchvision

    torch.set_num_threads(1)
    stub_torchvision()
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host import mha
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.utils import get_storage_hash_str
    from sglang.srt.runtime_context import get_parallel

    mha.transfer_kv_direct = transfer_kv_direct  # the one stand-in: no CPU kernel exists
    rendezvous = tempfile.mkdtemp(prefix="kvcr-replay-")
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}/store", world_size=1, rank=0)
    get_parallel().override_permanently(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_dcp_size=1, attn_dcp_rank=0
    )
    from tests.integrations.conftest import host_budget

    dtype = torch.bfloat16
    device = MHATokenToKVPool(DEVICE_TOKENS, PAGE, dtype, HEADS, HEAD_DIM, LAYERS, "cpu", False)
    allocator = PagedTokenToKVPoolAllocator(DEVICE_TOKENS, PAGE, dtype, "cpu", device, False)
    info = device.get_device_pool_infos()[0].buffer_info
    with host_budget():  # the pool holds 4 MiB: SGLang's 10 GiB reserve aside
        host = MHATokenToKVPoolHost(
            info, 1.0, 0, PAGE, "layer_first", pin_memory=False, device="cpu",
            device_capacity_tokens=DEVICE_TOKENS, start_layer=0, end_layer=LAYERS,
            host_token_capacity=HOST_BLOCKS * BLOCK,
        )  # fmt: skip
    extra: dict[str, Any] = {
        "backend_name": "kvcr_policy",
        "module_path": "kvcr_policy.integrations.sglang",
        "class_name": "KVCRPolicyStorage",
        "interface_v1": 1,
        "overrides": overrides,
    }
    if profile:
        extra["profile"] = profile
    controller = HiCacheController(
        allocator, host, PAGE, dist.group.WORLD, threading.Event(),
        write_policy="write_through", io_backend="direct", storage_backend="dynamic",
        prefetch_threshold=PAGE, model_name="mooncake-conversation",
        storage_backend_extra_config=extra, enable_storage_metrics=True,
    )  # fmt: skip
    return SimpleNamespace(
        torch=torch, hash=get_storage_hash_str, device=device, allocator=allocator, host=host,
        controller=controller,
    )  # fmt: skip
