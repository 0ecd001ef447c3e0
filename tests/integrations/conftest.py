"""Fixtures for the SGLang integration tests: real SGLang classes on a CPU-only machine.

Tests that need SGLang skip with a reason when it is absent, and fail under CI, where the README's
test command has installed it (``bash .ci/install-sglang.sh``: the pinned sglang==0.5.23 with the
CPU torch).
"""

from __future__ import annotations

import importlib.util
import os
import random
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.installs import missing

SGLANG_MISSING = "sglang==0.5.23 is not installed; run `bash .ci/install-sglang.sh` (.ci/run does)"
# Small enough for 2 cores and a shared CI box; every test's tier is one region of this size.
TIER = "64MiB"


def sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None


def load_sglang() -> SimpleNamespace:
    """The SGLang names the tests use (SGLang must be installed); also for the client
    processes the Mooncake tests start."""
    import torch

    # Two busy cores: with two intra-op threads small tensor ops take milliseconds each.
    torch.set_num_threads(1)
    from kvcr_policy.bench.torchvision_stub import stub_torchvision

    # pool_host imports torchvision through a model config; PyPI's wheel needs CUDA torch.
    stub_torchvision()
    from sglang.srt.mem_cache import hicache_storage as hs
    from sglang.srt.mem_cache.device_pool_info import (
        KVBufferLayout,
        KVBuffers,
        MambaStateBufferInfo,
        MHABufferInfo,
        MLABufferInfo,
    )
    from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
    from sglang.srt.mem_cache.pool_host.mha import (
        AsymmetricMHATokenToKVPoolHost,
        MHATokenToKVPoolHost,
    )
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from kvcr_policy.integrations import sglang as backend

    return SimpleNamespace(
        torch=torch,
        hs=hs,
        KVBufferLayout=KVBufferLayout,
        KVBuffers=KVBuffers,
        MHABufferInfo=MHABufferInfo,
        MLABufferInfo=MLABufferInfo,
        MHATokenToKVPoolHost=MHATokenToKVPoolHost,
        AsymmetricMHATokenToKVPoolHost=AsymmetricMHATokenToKVPoolHost,
        MLATokenToKVPoolHost=MLATokenToKVPoolHost,
        MambaPoolHost=MambaPoolHost,
        MambaStateBufferInfo=MambaStateBufferInfo,
        StorageBackendFactory=StorageBackendFactory,
        backend=backend,
    )


@pytest.fixture(scope="session")
def sg() -> SimpleNamespace:
    """The SGLang names the tests use; skips the test when SGLang is not installed."""
    if not sglang_installed():
        missing(SGLANG_MISSING)
    return load_sglang()


#: SGLang keeps 10 GiB of the machine's free memory in reserve when it sizes a host pool
#: (``pool_host/base.py``, HICACHE_HOST_MEMORY_RESERVE_BYTES), which a CI box shared with other
#: jobs may not have at the moment a test runs. The pools here hold a few MiB; they are booked
#: against SGLang's own budget scope (``host_memory_budget_scope``) of this size instead.
HOST_BUDGET = 1 << 30


def host_budget() -> Any:
    """SGLang's host-memory budget scope for test pools (SGLang must be imported first)."""
    from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope

    return host_memory_budget_scope(HOST_BUDGET)


@pytest.fixture(autouse=True)
def _sglang_host_budget(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test that builds SGLang pools books them against :data:`HOST_BUDGET` (the pool
    helpers below do so themselves, for the child processes that use them too)."""
    if request.node.get_closest_marker("sglang") is None or not sglang_installed():
        yield
        return
    load_sglang()
    with host_budget():
        yield


@pytest.fixture(autouse=True)
def _sglang_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No SGLang test knob or kvcr_policy variable of the developer's shell leaks in."""
    for name in list(os.environ):
        if name.startswith(("KVCR_POLICY_", "SGLANG_HICACHE_FILE_BACKEND_", "SGLANG_TEST_HICACHE")):
            monkeypatch.delenv(name)
    yield


def dynamic_extra(**extra: Any) -> dict[str, Any]:
    """The extra_config that selects our backend through SGLang's dynamic loader."""
    config: dict[str, Any] = {
        "backend_name": "kvcr_policy",
        "module_path": "kvcr_policy.integrations.sglang",
        "class_name": "KVCRPolicyStorage",
        "interface_v1": 1,
        "overrides": {"placement.capacity_bytes": TIER},
    }
    config.update(extra)
    return config


@pytest.fixture
def storage_config(sg: SimpleNamespace) -> Callable[..., Any]:
    """``storage_config(extra_config, **fields)`` -> a real HiCacheStorageConfig."""

    from kvcr_policy.bench.hicache import single_rank_config

    def make(extra_config: dict[str, Any] | None = None, **fields: Any) -> Any:
        return single_rank_config(extra_config, **{"model_name": "test/model", **fields})

    return make


@pytest.fixture
def make_backend(sg: SimpleNamespace, storage_config: Callable[..., Any]) -> Iterator[Any]:
    """``make_backend(**extra)``: our backend, built by SGLang's own StorageBackendFactory."""
    made: list[Any] = []

    def make(config_fields: dict[str, Any] | None = None, **extra: Any) -> Any:
        config = storage_config(dynamic_extra(**extra), **(config_fields or {}))
        backend = sg.StorageBackendFactory.create_backend("dynamic", config, None)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def mha_pool(
    sg: SimpleNamespace,
    layout: str,
    *,
    pages: int = 48,
    seed: int = 0,
    v_head_dim: int = 16,
) -> Any:
    """A real MHATokenToKVPoolHost on CPU (L=3, H=2, D=16, bf16, P=4), filled with random bytes;
    with another ``v_head_dim``, SGLang's AsymmetricMHATokenToKVPoolHost (K and V apart)."""
    torch = sg.torch
    layers, heads, head_dim, page = 3, 2, 16, 4
    device_tokens = 2 * page
    k = tuple(torch.zeros(device_tokens, heads, head_dim, dtype=torch.bfloat16) for _ in range(3))
    v = tuple(torch.zeros(device_tokens, heads, v_head_dim, dtype=torch.bfloat16) for _ in range(3))
    pointers = [torch.tensor([t.data_ptr() for t in side], dtype=torch.uint64) for side in (k, v)]
    info = sg.MHABufferInfo(
        buffers=sg.KVBuffers(
            k=k, v=v, k_data_ptrs=pointers[0], v_data_ptrs=pointers[1], layout=sg.KVBufferLayout.NHD
        ),
        page_size=page,
        head_num=heads,
        head_dim=head_dim,
        v_head_dim=v_head_dim,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    cls = sg.MHATokenToKVPoolHost if v_head_dim == head_dim else sg.AsymmetricMHATokenToKVPoolHost
    with host_budget():
        pool = cls(
            info,
            1.0,
            0,
            page,
            layout,
            pin_memory=False,
            device="cpu",
            device_capacity_tokens=device_tokens,
            start_layer=0,
            end_layer=layers,
            host_token_capacity=pages * page,
        )
    if v_head_dim == head_dim:
        fill_random(sg, pool, seed)
    return pool


def mla_pool(
    sg: SimpleNamespace, layout: str, *, pages: int = 48, seed: int = 0, dcp_size: int = 1
) -> Any:
    """A real MLATokenToKVPoolHost on CPU (L=3, kv_lora_rank 24 + rope 8, bf16, P=4); with
    ``dcp_size`` > 1, a DCP shard (SGLang hands it the page widened by ``dcp_size``)."""
    torch = sg.torch
    layers, page, rank, rope = 3, 4, 24, 8
    buffers = tuple(torch.zeros(2 * page, 1, rank + rope, dtype=torch.bfloat16) for _ in range(3))
    info = sg.MLABufferInfo(
        buffers=buffers,
        data_ptrs=torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64),
        layer_indices=tuple(range(layers)),
        device_layer_num=layers,
        page_size=page,
        kv_lora_rank=rank,
        qk_rope_head_dim=rope,
        kv_cache_dim=rank + rope,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    with host_budget():
        pool = sg.MLATokenToKVPoolHost(
            info,
            1.0,
            0,
            page * dcp_size,
            layout,
            pin_memory=False,
            device="cpu",
            dcp_size=dcp_size,
            device_capacity_tokens=2 * page,
            start_layer=0,
            end_layer=layers,
            target_layer_num=layers,
            host_token_capacity=pages * page,
        )
    fill_random(sg, pool, seed)
    return pool


def mamba_pool(sg: SimpleNamespace) -> Any:
    """A real MambaPoolHost on CPU: 2 Mamba layers, 4 checkpoints of state (temporal + conv)."""
    torch = sg.torch
    info = sg.MambaStateBufferInfo(
        temporal=torch.zeros(2, 4, 3, 5, dtype=torch.float32),
        conv=(torch.zeros(2, 4, 6, dtype=torch.float32),),
    )
    with host_budget():
        return sg.MambaPoolHost(
            info, 2.0, 0, device_capacity=4, pin_memory=False, device="cpu", layout="page_first"
        )


def fill_random(sg: SimpleNamespace, pool: Any, seed: int) -> None:
    """Random bits straight into the host buffer (the device-to-host kernels need a GPU)."""
    generator = sg.torch.Generator().manual_seed(seed)
    flat = pool.kv_buffer.view(-1).view(sg.torch.int16)
    flat.copy_(sg.torch.randint(-(2**15), 2**15, flat.shape, generator=generator))


def page_bytes_of(sg: SimpleNamespace, pool: Any, page: int) -> Any:
    """Page ``page``'s bytes as SGLang itself reads them (``get_data_page``), as int16."""
    return pool.get_data_page(page * pool.page_size, flat=True).view(sg.torch.int16).clone()


def token_indices(sg: SimpleNamespace, pool: Any, pages: list[int]) -> Any:
    """Host token indices of ``pages``, the way HiCache passes them."""
    size = pool.page_size
    rows = [sg.torch.arange(p * size, (p + 1) * size, dtype=sg.torch.int64) for p in pages]
    return sg.torch.cat(rows) if rows else sg.torch.zeros(0, dtype=sg.torch.int64)


def same_tensors(a: Any, b: Any) -> bool:
    """Whether two tensors hold equal elements (compare ``.view(int16)`` for exact bits)."""
    return bool(a.equal(b))


def round_trip(
    sg: SimpleNamespace, kit: SimpleNamespace, backend: Any, pool: Any, *, n: int, seed: int
) -> None:
    """``n`` random pages of ``pool`` stored and restored into other pages through HiCache's
    v1 calls, then again through v2 under other keys; every restored page byte-exact."""
    pages = random.Random(seed).sample(range(pool.page_num), 3 * n)
    src, dst1, dst2 = pages[:n], pages[n : 2 * n], pages[2 * n :]
    expected = [kit.page(pool, p) for p in src]

    keys = [f"v1-{i}" for i in range(n)]
    assert backend.batch_set_v1(keys, kit.indices(pool, src)) == [True] * n
    assert backend.batch_exists(keys) == n
    assert backend.batch_get_v1(keys, kit.indices(pool, dst1)) == [True] * n
    assert all(same_tensors(kit.page(pool, d), e) for d, e in zip(dst1, expected, strict=True))

    kv = sg.hs.PoolName.KV
    keys2 = [f"v2-{i}" for i in range(n)]
    put = sg.hs.PoolTransfer(name=kv, host_indices=kit.indices(pool, src), keys=keys2)
    assert backend.batch_set_v2([put]) == {kv: [True] * n}
    hit = backend.batch_exists_v2([*keys2, "absent"])
    assert isinstance(hit, sg.hs.PoolTransferResult)
    assert (hit.kv_hit_pages, hit.extra_pool_hit_pages) == (n, {kv: n})
    assert hit.restorable_prefix_pages == list(range(1, n + 1))
    take = sg.hs.PoolTransfer(name=kv, host_indices=kit.indices(pool, dst2), keys=keys2)
    assert backend.batch_get_v2([take]) == {kv: [True] * n}
    assert all(same_tensors(kit.page(pool, d), e) for d, e in zip(dst2, expected, strict=True))


@pytest.fixture
def kit(sg: SimpleNamespace) -> SimpleNamespace:
    """Host pool helpers bound to the SGLang modules: mha, mla, mamba, page, indices."""
    return SimpleNamespace(
        mha=lambda layout, **kw: mha_pool(sg, layout, **kw),
        mla=lambda layout, **kw: mla_pool(sg, layout, **kw),
        mamba=lambda: mamba_pool(sg),
        page=lambda pool, page: page_bytes_of(sg, pool, page),
        indices=lambda pool, pages: token_indices(sg, pool, pages),
    )
