"""Restore speed against a real peer: SGLang's HiCacheFile on tmpfs, same pages, same host pool.

Behind ``kvcr-policy bench --peer hicache-file``: :func:`run_peer_bench` builds one real
``MHATokenToKVPoolHost`` on the CPU from a geometry preset, fills the first half of its pages
with random bytes, and for each backend stores those pages and restores them into the second
half, the way HiCache calls it (batches of ``STORAGE_BATCH_SIZE`` = 128 pages, consecutive
host indices as a fresh allocation hands out):

- ``HiCacheFile`` through its v2 API (it has no v1 in 0.5.23), one file per page in a fresh
  folder on ``/dev/shm`` (tmpfs), removed afterwards;
- ``KVCRPolicyStorage`` through the zero-copy v1 API with the profile given.

Runs alternate in both orders (peer then ours, ours then peer), figures are medians, and every
restored byte is compared with the stored page before a run counts. Each store starts from an
empty backend (both skip keys they already hold). The limit measured in the same run is one
large copy of the same bytes (``limit_gbps``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..backends.dram.transports.base import CopyBatch, Endpoint
from ..descriptors import Descriptors
from ..geometry import LAYOUTS, PRESETS, Layout, PoolGeometry, preset
from ..loading import load_config

__all__ = ["run_peer_bench"]

BATCH_PAGES = 128  # sglang/srt/mem_cache/hicache_storage.py: STORAGE_BATCH_SIZE
PEER = "hicache-file"


def _host_pool(geometry: PoolGeometry, pages: int) -> Any:
    """A real MHATokenToKVPoolHost on the CPU holding ``pages`` pages of ``geometry``."""
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
        host_token_capacity=pages * geometry.page_size,
    )


def _planes(pool: Any, geometry: PoolGeometry) -> np.ndarray:
    """The pool buffer as ``(fragments_per_page, pages, fragment_bytes)`` uint8, no copy."""
    import torch

    flat = pool.kv_buffer.view(-1).view(torch.uint8).numpy()
    return flat.reshape(geometry.fragments_per_page, -1, geometry.fragment_bytes)


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


@contextmanager
def _file_peer(pool: Any, root: str) -> Iterator[Any]:
    """HiCacheFile in a fresh folder under ``root``; the folder is removed afterwards."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, PoolName

    folder = tempfile.mkdtemp(prefix="kvcr-bench-hicache-", dir=root)
    # The env var would win over extra_config's folder (HiCacheFile.__init__).
    saved = os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)
    try:
        peer = HiCacheFile(single_rank_config({"file_storage_path": folder}), file_path=folder)
        peer.register_mem_host_pool_v2(pool, PoolName.KV)
        yield peer
    finally:
        if saved is not None:
            os.environ["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = saved
        shutil.rmtree(folder, ignore_errors=True)


def _batches(keys: list[str], first_page: int, page_size: int) -> list[tuple[list[str], Any]]:
    import torch

    out = []
    for start in range(0, len(keys), BATCH_PAGES):
        chunk = keys[start : start + BATCH_PAGES]
        lo = (first_page + start) * page_size
        out.append((chunk, torch.arange(lo, lo + len(chunk) * page_size, dtype=torch.int64)))
    return out


def _v2_calls(peer: Any, keys: list[str], n: int, page_size: int) -> tuple[Callable[[], bool], ...]:
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    def run(method: Callable[..., dict[Any, list[bool]]], first_page: int) -> bool:
        ok = True
        for chunk, indices in _batches(keys, first_page, page_size):
            done = method([PoolTransfer(name=PoolName.KV, host_indices=indices, keys=chunk)])
            ok = ok and all(done[PoolName.KV])
        return ok

    return (lambda: run(peer.batch_set_v2, 0), lambda: run(peer.batch_get_v2, n))


def _v1_calls(ours: Any, keys: list[str], n: int, page_size: int) -> tuple[Callable[[], bool], ...]:
    def run(method: Callable[..., list[bool]], first_page: int) -> bool:
        ok = True
        for chunk, indices in _batches(keys, first_page, page_size):
            ok = all(method(chunk, indices)) and ok
        return ok

    return (lambda: run(ours.batch_set_v1, 0), lambda: run(ours.batch_get_v1, n))


def _timed(call: Callable[[], bool]) -> tuple[float, bool]:
    start = time.perf_counter()
    ok = call()
    return time.perf_counter() - start, ok


@dataclass(frozen=True)
class _Pages:
    """The pages both backends store (``src``) and restore (into ``dst``), and their keys."""

    geometry: PoolGeometry
    n: int
    src: np.ndarray
    dst: np.ndarray
    keys: list[str]

    @property
    def nbytes(self) -> int:
        return self.n * self.geometry.page_bytes

    def restored(self) -> bool:
        """Every byte of every restored page equals the stored page."""
        planes = range(self.geometry.fragments_per_page)
        return all(np.array_equal(self.src[f], self.dst[f]) for f in planes)

    def limit_gbps(self, transport: Any) -> float:
        """One large copy of the same bytes per plane, through our backend's own transport
        (the same copy threads and primitive): the engine benchmark's limit."""
        self.dst[...] = 0
        src = np.array([self.src[f].ctypes.data for f in range(len(self.src))], dtype=np.int64)
        dst = np.array([self.dst[f].ctypes.data for f in range(len(self.dst))], dtype=np.int64)
        lengths = np.array([self.src[f].nbytes for f in range(len(self.src))], dtype=np.int64)
        base = int(min(src.min(), dst.min()))
        span = int(max(src.max(), dst.max())) + int(lengths.max()) - base
        whole = Endpoint(base, span)
        batch = CopyBatch(whole, whole, Descriptors.from_arrays(src - base, dst - base, lengths))
        start = time.perf_counter()
        transport.submit(batch).result()
        return self.nbytes / (time.perf_counter() - start) / 1e9


def _pages(geometry_name: str, layout: str, tokens: int) -> tuple[Any, _Pages]:
    dims = PRESETS.get(geometry_name)
    if dims is None:
        preset(geometry_name, layout="page_first", tokens=1)  # raises, naming the presets
        raise AssertionError("unreachable")
    page_size = int(dims["page_size"])
    n = max(1, tokens // page_size)
    geometry = preset(geometry_name, layout=cast(Layout, layout), tokens=2 * n * page_size)
    pool = _host_pool(geometry, 2 * n)
    planes = _planes(pool, geometry)
    src, dst = planes[:, :n], planes[:, n:]
    rng = np.random.default_rng(0)
    for f in range(geometry.fragments_per_page):
        src[f] = rng.integers(0, 256, size=src[f].shape, dtype=np.uint8)
    # SGLang's keys are sha256 hex digests of the token chain.
    keys = [hashlib.sha256(f"page {i}".encode()).hexdigest() for i in range(n)]
    return pool, _Pages(geometry, n, src, dst, keys)


def _measure(
    pages: _Pages, sides: dict[str, tuple[Any, ...]], repeat: int, order_both: bool
) -> list[dict[str, Any]]:
    """Store then restore through each side, in both orders; one record per side and run."""
    runs = []
    orders = [("peer", "P"), ("P", "peer")] if order_both else [("peer", "P")]
    for rep in range(repeat):
        for order in orders:
            limit = pages.limit_gbps(sides["P"][1].pipeline.transport)
            for side in order:
                name, backend, store, restore = sides[side]
                backend.clear()  # both skip keys they hold: every store starts empty
                store_s, stored = _timed(store)
                pages.dst[...] = 0
                restore_s, restored = _timed(restore)
                runs.append(
                    {
                        "repeat": rep,
                        "order": ",".join(order),
                        "profile": name,
                        "side": side,
                        "store_gbps": pages.nbytes / store_s / 1e9,
                        "restore_gbps": pages.nbytes / restore_s / 1e9,
                        "limit_gbps": limit,
                        "verified": stored and restored and pages.restored(),
                    }
                )
    return runs


def run_peer_bench(
    profile: str | None,
    *,
    tokens: int,
    layout: str = "layer_first",
    geometry_name: str = "small",
    repeat: int = 3,
    order_both: bool = True,
    folder: str | None = None,
) -> dict[str, Any]:
    """Store and restore ``tokens`` tokens through HiCacheFile and through our backend.

    Returns the keys of ``kvcr-policy bench`` with HiCacheFile as the baseline (side ``peer``;
    ours is side ``P``), plus ``peer_gbps`` and ``speedup_vs_peer`` (restores) and
    ``peer_store_gbps``: medians in GB/s, the copy limit of the same run, and ``verified``
    (every restored byte of every run compared). ``folder`` holds HiCacheFile's files:
    ``/dev/shm`` (tmpfs) when it exists.
    """
    from .sglang_cpu import stub_torchvision

    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {', '.join(LAYOUTS)}, got {layout!r}")
    stub_torchvision()
    import torch

    threads = torch.get_num_threads()
    # HiCacheFile copies each page with a few small torch ops; on two busy cores a second
    # intra-op thread makes each take milliseconds (shared/notes/sglang-on-cpu.md).
    torch.set_num_threads(1)
    try:
        pool, pages = _pages(geometry_name, layout, tokens)
        root = folder or ("/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir())
        return _run(profile, pool, pages, root, repeat, order_both)
    finally:
        torch.set_num_threads(threads)


def _run(
    profile: str | None, pool: Any, pages: _Pages, root: str, repeat: int, order_both: bool
) -> dict[str, Any]:
    from .sglang import KVCRPolicyStorage

    # The tier must hold every page, or we would measure evictions.
    capacity = int(load_config(profile).config.placement.capacity_bytes)
    overrides = {"placement.capacity_bytes": pages.nbytes} if capacity < pages.nbytes else {}
    extra: dict[str, Any] = {"interface_v1": 1, "overrides": overrides}
    if profile is not None:
        extra["profile"] = profile
    n, page_size = pages.n, pages.geometry.page_size
    ours = KVCRPolicyStorage(single_rank_config(extra), {})
    try:
        ours.register_mem_pool_host(pool)
        with _file_peer(pool, root) as peer:
            sides = {
                "peer": (PEER, peer, *_v2_calls(peer, pages.keys, n, page_size)),
                "P": (profile or "default", ours, *_v1_calls(ours, pages.keys, n, page_size)),
            }
            runs = _measure(pages, sides, repeat, order_both)
        stats = ours.pipeline.stats().to_dict()
        profile_path = ours.loaded.profile
    finally:
        ours.close()

    def median(side: str, key: str = "restore_gbps", order: str | None = None) -> float:
        values = [r[key] for r in runs if r["side"] == side and order in (None, r["order"])]
        return round(statistics.median(values), 3)

    limit = round(statistics.median(r["limit_gbps"] for r in runs), 3)
    restore, peer_gbps = median("P"), median("peer")
    store, peer_store = median("P", "store_gbps"), median("peer", "store_gbps")
    orders = {r["order"] for r in runs}
    return {
        "target": "cpu",
        "peer": PEER,
        "profile": profile or "default",
        "geometry": pages.geometry.name,
        "layout": pages.geometry.layout,
        "mla": False,
        "tokens": n * page_size,
        "pages": n,
        "page_bytes": pages.geometry.page_bytes,
        "bytes": pages.nbytes,
        "scatter": False,
        "repeat": repeat,
        "verified": all(r["verified"] for r in runs),
        "limit_gbps": limit,
        "restore_gbps": restore,
        "peer_gbps": peer_gbps,
        "baseline_gbps": peer_gbps,
        "ratio_to_limit": round(restore / limit, 3),
        "speedup_vs_peer": round(restore / peer_gbps, 3),
        "speedup_vs_baseline": round(restore / peer_gbps, 3),
        "store_gbps": store,
        "peer_store_gbps": peer_store,
        "baseline_store_gbps": peer_store,
        "store_speedup_vs_peer": round(store / peer_store, 3),
        "orders": {
            order: {
                "restore_gbps": median("P", order=order),
                "baseline_gbps": median("peer", order=order),
            }
            for order in sorted(orders)
        },
        "profiles": {
            "P": {"name": profile or "default", "path": profile_path},
            "peer": {"name": PEER, "path": root},
        },
        "capacity_override": overrides.get("placement.capacity_bytes"),
        "descriptors": {
            "P": {
                "before": stats["descriptors_before"],
                "after": stats["descriptors_after"],
                "batches": stats["batches"],
                "peak_inflight_batches": stats["peak_inflight_batches"],
            }
        },
        "transport": stats["transport"],
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> None:
    """``python -m kvcr_policy.integrations.sglang_bench``: the JSON of one run."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description=run_peer_bench.__doc__)
    parser.add_argument("--profile", default="throughput")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--layout", default="layer_first", choices=LAYOUTS)
    parser.add_argument("--geometry", default="small")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    result = run_peer_bench(
        args.profile,
        tokens=args.tokens,
        layout=args.layout,
        geometry_name=args.geometry,
        repeat=args.repeat,
    )
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
