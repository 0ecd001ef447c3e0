"""P against SGLang's HiCacheFile (``--peer hicache-file``), on one real SGLang host pool.

One ``MHATokenToKVPoolHost`` is built on the CPU from the geometry preset (2n pages); both
sides store its first n pages and restore them into its last n, the way HiCache calls a
storage backend (batches of ``STORAGE_BATCH_SIZE`` = 128 pages):

- ``peer``: ``HiCacheFile`` through its v2 API (it has no v1 in 0.5.23), one file per page in
  a fresh folder, removed afterwards: under P's ``backend.options.path`` when P runs on the
  ``file`` backend (the same file system for both), else ``/dev/shm`` (tmpfs) when it exists;
- ``P``: :class:`~kvcr_policy.integrations.sglang.KVCRPolicyStorage` through the zero-copy v1
  API with P's profile, on the run's backend.

SGLang 0.5.23 is pinned by the integration; its host pool imports torchvision, which a
CPU-only machine cannot install, so :mod:`.torchvision_stub` stands in for it here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from ..geometry import PoolGeometry
from .plan import Plan, Side
from .setup import BenchError
from .sides import side_overrides
from .targets import HostPool, Pool
from .torchvision_stub import stub_torchvision

__all__ = ["BATCH_PAGES", "PEER", "HiCacheFileComparison", "single_rank_config"]

BATCH_PAGES = 128  # sglang/srt/mem_cache/hicache_storage.py: STORAGE_BATCH_SIZE
PEER = "hicache-file"
SGLANG_MISSING = (
    "--peer hicache-file needs sglang==0.5.23: in the kvcr-policy clone, pip install -e "
    "'.[sglang]' on a GPU server, or bash .ci/install-sglang.sh on a CPU-only machine"
)


def single_rank_config(extra_config: dict[str, Any] | None = None, **fields: Any) -> Any:
    """A real HiCacheStorageConfig of one rank (tp = pp = attention-cp = 1); ``fields``
    replace any of its values."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    values: dict[str, Any] = dict(
        tp_rank=0,
        tp_size=1,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=False,
        enable_storage_metrics=False,
        is_page_first_layout=False,
        model_name="kvcr-policy-bench",
    )
    values.update(fields)
    return HiCacheStorageConfig(extra_config=extra_config, **values)


def host_pool(geometry: PoolGeometry) -> Any:
    """A real MHATokenToKVPoolHost on the CPU holding the pages of ``geometry``."""
    import torch
    from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    dtype = getattr(torch, geometry.dtype)
    rows = 2 * geometry.page_size  # the device pool only has to exist: nothing copies from it
    shape = (rows, geometry.heads, geometry.head_dim)
    k = tuple(torch.zeros(shape, dtype=dtype) for _ in range(geometry.layers))
    v = tuple(torch.zeros(shape, dtype=dtype) for _ in range(geometry.layers))
    k_ptrs, v_ptrs = (torch.tensor([t.data_ptr() for t in s], dtype=torch.uint64) for s in (k, v))
    buffers = KVBuffers(k=k, v=v, k_data_ptrs=k_ptrs, v_data_ptrs=v_ptrs, layout=KVBufferLayout.NHD)
    info = MHABufferInfo(
        buffers=buffers,
        page_size=geometry.page_size,
        head_num=geometry.heads,
        head_dim=geometry.head_dim,
        v_head_dim=geometry.head_dim,
        dtype=dtype,
        device=torch.device("cpu"),
    )
    return MHATokenToKVPoolHost(
        info,
        1.0,
        0,
        geometry.page_size,
        geometry.layout,
        pin_memory=False,
        device="cpu",
        device_capacity_tokens=rows,
        start_layer=0,
        end_layer=geometry.layers,
        host_token_capacity=geometry.tokens,
    )


def _batches(keys: list[str], tokens: np.ndarray) -> Iterator[tuple[list[str], Any]]:
    """HiCache's calls: up to 128 keys and their token indices (an int64 tensor)."""
    import torch

    per_key = len(tokens) // max(1, len(keys))
    for start in range(0, len(keys), BATCH_PAGES):
        chunk = keys[start : start + BATCH_PAGES]
        indices = tokens[start * per_key : (start + len(chunk)) * per_key]
        yield chunk, torch.from_numpy(np.ascontiguousarray(indices))


def open_host_pool(stack: ExitStack, plan: Plan) -> tuple[Any, Pool, Any]:
    """What a comparison with an SGLang store opens first: SGLang's host pool of the measured
    geometry, that pool as the bench sees it, and P's backend started (closed with
    ``stack``)."""
    stub_torchvision()
    _threads(stack)
    geometry = plan.target.geometry(plan.measured)
    sglang_pool = host_pool(geometry)
    pool = HostPool(geometry, sglang_pool.kv_buffer)
    started = stack.enter_context(plan.backend.start("P", plan.setup.profile, plan.measured))
    return sglang_pool, pool, started


class V1Side:
    """A side that stores and restores through a HiCache storage's v1 API (``batch_set_v1``,
    ``batch_get_v1``: keys and their token indices), in HiCache's batches."""

    #: The HiCache storage object the side calls.
    storage: Any

    def _run(self, method: Callable[..., list[bool]], keys: list[str], tokens: np.ndarray) -> bool:
        ok = True
        for chunk, indices in _batches(keys, tokens):
            ok = all(method(chunk, indices)) and ok
        return ok

    def store(self, keys: list[str], tokens: np.ndarray) -> bool:
        return self._run(self.storage.batch_set_v1, keys, tokens)

    def restore(self, keys: list[str], tokens: np.ndarray) -> bool:
        return self._run(self.storage.batch_get_v1, keys, tokens)


class StorageSide(V1Side):
    """P through KVCRPolicyStorage's v1 API, as SGLang calls it."""

    def __init__(self, name: str, storage: Any) -> None:
        self.label, self.name = "P", name
        self.storage = storage
        self.path: str | None = storage.loaded.profile
        self.pipeline = storage.pipeline


class HiCacheFileSide:
    """SGLang's HiCacheFile through its v2 API, one file per page under ``folder``."""

    pipeline = None

    def __init__(self, peer: Any, folder: str) -> None:
        self.label, self.name, self.path = "peer", PEER, folder
        self.peer = peer

    def _run(self, method: Callable[..., Any], keys: list[str], tokens: np.ndarray) -> bool:
        from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

        ok = True
        for chunk, indices in _batches(keys, tokens):
            done = method([PoolTransfer(name=PoolName.KV, host_indices=indices, keys=chunk)])
            ok = all(done[PoolName.KV]) and ok
        return ok

    def store(self, keys: list[str], tokens: np.ndarray) -> bool:
        return self._run(self.peer.batch_set_v2, keys, tokens)

    def restore(self, keys: list[str], tokens: np.ndarray) -> bool:
        return self._run(self.peer.batch_get_v2, keys, tokens)


@contextmanager
def _file_peer(pool: Any, root: str) -> Iterator[HiCacheFileSide]:
    """HiCacheFile in a fresh folder under ``root``; the folder is removed afterwards."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, PoolName

    folder = tempfile.mkdtemp(prefix="kvcr-bench-hicache-", dir=root)
    # The env var would win over extra_config's folder (HiCacheFile.__init__).
    saved = os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
    try:
        peer = HiCacheFile(single_rank_config({"file_storage_path": folder}), file_path=folder)
        peer.register_mem_host_pool_v2(pool, PoolName.KV)
        yield HiCacheFileSide(peer, root)
    finally:
        if saved is not None:
            os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = saved
        shutil.rmtree(folder, ignore_errors=True)


def _threads(stack: ExitStack) -> None:
    """One intra-op torch thread for the run: HiCacheFile copies each page with a few small
    torch ops, and on two busy cores a second thread makes each take milliseconds."""
    import torch

    stack.callback(torch.set_num_threads, torch.get_num_threads())
    torch.set_num_threads(1)


class HiCacheFileComparison:
    """P (through KVCRPolicyStorage) against HiCacheFile, on one SGLang host pool."""

    baseline = "peer"

    def __init__(self) -> None:
        self._profile = ""
        self._capacity = 0

    def check(self, plan: Plan) -> None:
        setup = plan.setup
        refusals = {
            "target": (setup.target != "cpu", "--target cpu (SGLang's host pool is host memory)"),
            "backend": (
                plan.backend.name not in ("dram", "file"),
                "--backend dram or file (HiCacheFile is local)",
            ),
            "mla": (setup.mla, "an MHA pool (drop --mla: the comparison builds an MHA host pool)"),
        }
        for what, (refused, needs) in refusals.items():
            if refused:
                raise BenchError(f"--peer {PEER} runs with {needs}; {what} differs")
        if find_spec("sglang") is None:
            raise BenchError(SGLANG_MISSING)
        if setup.folder is not None and not os.access(setup.folder, os.W_OK | os.X_OK):
            raise BenchError(f"--peer {PEER}: folder {setup.folder!r} is not a writable folder")

    def open(self, stack: ExitStack, plan: Plan) -> tuple[Pool, dict[str, Side]]:
        from ..integrations.sglang import KVCRPolicyStorage

        sglang_pool, pool, started = open_host_pool(stack, plan)
        overrides = side_overrides(plan, started)
        self._profile = plan.setup.profile
        self._capacity = int(overrides.get("placement.capacity_bytes", 0))
        extra = {"interface_v1": 1, "profile": plan.setup.profile, "overrides": overrides}
        storage = KVCRPolicyStorage(single_rank_config(extra), {})
        stack.callback(storage.close)
        storage.register_mem_pool_host(sglang_pool)
        on_disk = overrides.get("backend.options.path") if plan.backend.name == "file" else None
        shm = "/dev/shm" if Path("/dev/shm").is_dir() else None
        root = plan.setup.folder or on_disk or shm
        peer = stack.enter_context(_file_peer(sglang_pool, root or tempfile.gettempdir()))
        return pool, {"P": StorageSide(plan.setup.profile, storage), "peer": peer}

    def describe(self) -> dict[str, Any]:
        return {"peer": PEER, "profile": self._profile, "capacity_override": self._capacity}
