"""A stand-in for one SGLang scheduler process, started the way SGLang starts them (spawn).

It inherits ``PROMETHEUS_MULTIPROC_DIR`` from its parent, builds our backend through SGLang's
own ``StorageBackendFactory`` over a real ``MHATokenToKVPoolHost``, stores and restores pages
through the v1 API, and reports what it did; its metrics land in the multiprocess folder that
SGLang's ``/metrics`` reads.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def run(profile: str, tier: str, report: Any, stop: Any) -> None:
    """Move pages, put what happened on ``report``, then serve until ``stop`` is set."""
    import torch

    from kvcr_policy.bench.torchvision_stub import stub_torchvision

    torch.set_num_threads(1)
    stub_torchvision()
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from tests.integrations.conftest import mha_pool, token_indices

    sg = SimpleNamespace(
        torch=torch,
        KVBufferLayout=KVBufferLayout,
        KVBuffers=KVBuffers,
        MHABufferInfo=MHABufferInfo,
        MHATokenToKVPoolHost=MHATokenToKVPoolHost,
    )
    extra = {
        "backend_name": "kvcr_policy",
        "module_path": "kvcr_policy.integrations.sglang",
        "class_name": "KVCRPolicyStorage",
        "interface_v1": 1,
        "profile": profile,
        "overrides": {"placement.capacity_bytes": tier},
    }
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
        model_name="test/metrics", extra_config=extra,
    )  # fmt: skip
    backend = StorageBackendFactory.create_backend("dynamic", config, None)
    try:
        pool = mha_pool(sg, "layer_first")
        backend.register_mem_pool_host(pool)
        keys = [f"page-{i}" for i in range(10)]
        stored = backend.batch_set_v1(keys, token_indices(sg, pool, list(range(10))))
        present = backend.batch_exists([*keys, "absent"])
        got = backend.batch_get_v1(
            [*keys[:6], "absent", "absent-too"], token_indices(sg, pool, list(range(20, 28)))
        )
        page_bytes = backend.pools["kv"].geometry.page_bytes
        report.put({"stored": stored, "present": present, "got": got, "page_bytes": page_bytes})
        stop.wait(120)  # a scheduler keeps its tier while SGLang runs
    finally:
        backend.close()
