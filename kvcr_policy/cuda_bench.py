"""``kvcr-policy bench --target cuda``: restores into a GPU pool as ratios to a pinned-copy limit.

The pool lives on the GPU and is filled there with random words; each profile's pipeline fills
its own pinned tier by *offloading* the pool (GPU -> tier), so no host copy of the source pages
is needed and host memory holds only the two tiers. Then, in both orders (P then Q, Q then P),
``repeat`` times, the pool is poisoned, restored from the tier (tier -> GPU), and verified by
per-page checksums computed on the GPU. The limit is measured in the same run, before each
order: one pinned host-to-device copy of ``limit_bytes`` (4 GiB), timed with CUDA events.

With ``scatter`` the keys are stored in a random order, so each key's slot is unrelated to its
neighbours' and no two fragments of a restore are contiguous in the tier (as after eviction
churn): coalescing has nothing to merge, and the transport's gather path is what is measured.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .backends.dram.transports.cuda import CudaUnavailableError, require_cuda
from .bench import descriptor_summary
from .errors import KVCRPolicyError
from .geometry import PoolGeometry, preset
from .loading import LoadedConfig, load_config
from .pipeline import Pipeline, build_pipeline

__all__ = ["CudaBenchError", "CudaUnavailableError", "run_cuda_bench"]

Progress = Callable[[str], None]

LIMIT_BYTES = 4 << 30
_POISON = 0xA5
# Scratch of the checksum pass: at most this many bytes of products at a time.
_CHECKSUM_CHUNK = 1 << 30


class CudaBenchError(KVCRPolicyError):
    """The CUDA benchmark cannot run as asked (GPU memory, a profile that stores nothing)."""


def run_cuda_bench(
    profile: str,
    vs: str,
    *,
    geometry_name: str = "qwen3-32b",
    layout: str = "layer_first",
    tokens: int = 8192,
    repeat: int = 3,
    scatter: bool = False,
    mla: bool = False,
    overrides: Mapping[str, Any] | None = None,
    limit_bytes: int = LIMIT_BYTES,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Offload ``tokens`` tokens from a GPU pool with P and Q, restore them, verify, compare.

    Raises :class:`CudaUnavailableError` ("no CUDA device visible") where torch sees no GPU.
    """
    torch = require_cuda()
    say = progress or (lambda message: None)
    geometry = preset(
        geometry_name,
        layout=layout,  # type: ignore[arg-type]
        tokens=tokens,
        mla=mla,
        device=f"cuda:{torch.cuda.current_device()}",
    )
    nbytes = geometry.nbytes
    _check_gpu_memory(torch, nbytes, limit_bytes)
    pool = torch.empty(geometry.shape, dtype=getattr(torch, geometry.dtype), device=geometry.device)
    flat = pool.view(-1).view(torch.uint8)
    say(f"filling {nbytes / 2**30:.2f} GiB of GPU pool pages with random words")
    flat.view(torch.int64).random_()
    expected = _checksums(torch, flat, geometry)
    limit = _Limit(torch, limit_bytes, geometry.device)

    n = geometry.pages
    keys = [hashlib.sha256(f"cuda-bench:{i}".encode()).hexdigest() for i in range(n)]
    pages = np.arange(n, dtype=np.int64)
    order = np.random.default_rng(0).permutation(n) if scatter else pages
    base = {"transport.name": "cuda", "placement.capacity_bytes": nbytes, **(overrides or {})}
    sides: dict[str, _Side] = {}
    runs: list[dict[str, Any]] = []
    try:
        for label, name in (("P", profile), ("Q", vs)):
            say(f"{name}: registering a {nbytes / 2**30:.2f} GiB tier, offloading the pool")
            sides[label] = _Side(torch, name, load_config(profile=name, overrides=base), geometry)
            sides[label].store(pool, [keys[i] for i in order], _tokens(geometry, order))
        verified = True
        for rep in range(repeat):
            for labels in (("P", "Q"), ("Q", "P")):
                limit_gbps = limit.measure()
                for label in labels:
                    side = sides[label]
                    gbps, ok = side.restore(flat, keys, _tokens(geometry, pages), expected)
                    verified &= ok
                    runs.append(
                        {
                            "repeat": rep,
                            "order": ",".join(labels),
                            "profile": side.name,
                            "side": label,
                            "restore_gbps": round(gbps, 3),
                            "limit_gbps": round(limit_gbps, 3),
                            "verified": ok,
                        }
                    )
                    shown = ",".join(labels)
                    say(f"{side.name}: {gbps:.2f} GB/s, limit {limit_gbps:.2f} ({shown})")
        stats = {label: side.pipeline.stats().to_dict() for label, side in sides.items()}
    finally:
        for side in sides.values():
            side.pipeline.close()
    return _report(
        runs=runs,
        verified=verified,
        sides=sides,
        stats=stats,
        limit=limit,
        geometry=geometry,
        setup={
            "geometry": geometry_name,
            "layout": layout,
            "mla": mla,
            "tokens": tokens,
            "pages": n,
            "bytes": nbytes,
            "scatter": scatter,
            "repeat": repeat,
        },
        device=torch.cuda.get_device_name(),
    )


def _tokens(geometry: PoolGeometry, pages: np.ndarray) -> np.ndarray:
    size = geometry.page_size
    return (pages[:, None] * size + np.arange(size, dtype=np.int64)).reshape(-1)


def _check_gpu_memory(torch: Any, nbytes: int, limit_bytes: int) -> None:
    free, _ = torch.cuda.mem_get_info()
    # The pool, the limit copy's destination, and gather scratch / index memory.
    needed = nbytes + limit_bytes + (1 << 30)
    if needed > free:
        message = (
            f"the CUDA benchmark needs about {needed / 2**30:.1f} GiB of GPU memory (pool "
            f"{nbytes / 2**30:.1f} GiB, limit copy {limit_bytes / 2**30:.1f} GiB, scratch); "
            f"{free / 2**30:.1f} GiB is free; lower --tokens"
        )
        raise CudaBenchError(message)


def _checksums(torch: Any, flat: Any, geometry: PoolGeometry) -> Any:
    """One int64 per page, on the GPU: its words times their position in the page, summed.

    Wrapping int64 arithmetic; a swapped, shifted, missing or stale fragment changes it.
    """
    planes, pages = geometry.fragments_per_page, geometry.pages
    width = geometry.fragment_bytes // 8
    words = flat.view(torch.int64).view(planes, pages, width)
    out = torch.zeros(pages, dtype=torch.int64, device=flat.device)
    step = max(1, _CHECKSUM_CHUNK // (width * 8))
    position = torch.arange(width, dtype=torch.int64, device=flat.device)
    for plane in range(planes):
        weights = (position + plane * width) * 2 + 1
        for start in range(0, pages, step):
            stop = min(start + step, pages)
            out[start:stop] += (words[plane, start:stop] * weights).sum(dim=1)
    return out


class _Limit:
    """One pinned host-to-device copy of ``nbytes``, timed with events (and device-to-host)."""

    def __init__(self, torch: Any, nbytes: int, device: str) -> None:
        self.torch = torch
        self.nbytes = nbytes
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.host.fill_(0x5A)
        self.gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.h2d: list[float] = []
        self.d2h: list[float] = []
        self._time(self.gpu, self.host)  # warm-up

    def _time(self, dst: Any, src: Any) -> float:
        torch = self.torch
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        dst.copy_(src, non_blocking=True)
        stop.record()
        stop.synchronize()
        return self.nbytes / (start.elapsed_time(stop) / 1e3) / 1e9

    def measure(self) -> float:
        self.h2d.append(self._time(self.gpu, self.host))
        self.d2h.append(self._time(self.host, self.gpu))
        return self.h2d[-1]


class _Side:
    """One profile's pipeline (cuda transport) with the GPU pool registered."""

    def __init__(self, torch: Any, name: str, loaded: LoadedConfig, geometry: PoolGeometry):
        self.torch = torch
        self.name = name
        self.loaded = loaded
        self.geometry = geometry
        self.pipeline: Pipeline = build_pipeline(loaded)
        self.store_gbps = 0.0

    def store(self, pool: Any, keys: list[str], tokens: np.ndarray) -> None:
        self.pipeline.register_pool("kv", self.geometry, pool)
        self.torch.cuda.synchronize()
        start = time.perf_counter()
        stored = self.pipeline.set(keys, tokens)
        seconds = time.perf_counter() - start
        if not all(stored):
            message = f"profile {self.name!r} stored {sum(stored)} of {len(keys)} pages"
            raise CudaBenchError(message)
        self.store_gbps = self.geometry.nbytes / seconds / 1e9

    def restore(
        self, flat: Any, keys: list[str], tokens: np.ndarray, expected: Any
    ) -> tuple[float, bool]:
        torch = self.torch
        flat.fill_(_POISON)
        torch.cuda.synchronize()
        start = time.perf_counter()
        got = self.pipeline.get(keys, tokens)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        ok = all(got) and bool(torch.equal(_checksums(torch, flat, self.geometry), expected))
        return self.geometry.nbytes / seconds / 1e9, ok


def _report(
    *,
    runs: list[dict[str, Any]],
    verified: bool,
    sides: dict[str, _Side],
    stats: dict[str, dict[str, Any]],
    limit: _Limit,
    geometry: PoolGeometry,
    setup: dict[str, Any],
    device: str,
) -> dict[str, Any]:
    def median(label: str, order: str | None = None) -> float:
        return statistics.median(
            r["restore_gbps"]
            for r in runs
            if r["side"] == label and (order is None or r["order"] == order)
        )

    limit_gbps = statistics.median(limit.h2d)
    p, q = median("P"), median("Q")
    return {
        "target": "cuda",
        "device": device,
        **setup,
        "verified": verified,
        "limit": f"one pinned {limit.nbytes >> 30} GiB host-to-device copy (CUDA events)",
        "limit_gbps": round(limit_gbps, 3),
        "limit_d2h_gbps": round(statistics.median(limit.d2h), 3),
        "restore_gbps": round(p, 3),
        "baseline_gbps": round(q, 3),
        "ratio_to_limit": round(p / limit_gbps, 3),
        "baseline_ratio_to_limit": round(q / limit_gbps, 3),
        "speedup_vs_baseline": round(p / q, 3),
        "store_gbps": round(sides["P"].store_gbps, 3),
        "baseline_store_gbps": round(sides["Q"].store_gbps, 3),
        "fill": "each tier filled by offload from the GPU pool (no host source pool)",
        "orders": {
            order: {"restore_gbps": median("P", order), "baseline_gbps": median("Q", order)}
            for order in ("P,Q", "Q,P")
        },
        "profiles": {
            label: {"name": side.name, "path": side.loaded.profile} for label, side in sides.items()
        },
        "descriptors": descriptor_summary(stats),
        "transport": {label: s["transport"] for label, s in stats.items()},
        "runs": runs,
    }
