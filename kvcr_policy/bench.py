"""The benchmark behind ``kvcr-policy bench``: restore rates as ratios to limits of the same run.

One host pool buffer holds the source pages (first half) and the destination pages (second
half): pages are stored from the first half and restored into the second, as HiCache restores
into free pages of its host pool. Each profile gets its own pipeline and tier; restores run in
both orders (P then Q, Q then P), ``repeat`` times each, every restored byte is verified, and the
limit (one contiguous copy of the same bytes with the same copy threads) is measured beside them.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import KVCRPolicyError
from .geometry import PRESETS, PoolGeometry, preset
from .loading import LoadedConfig, load_config
from .pipeline import Pipeline, build_pipeline

__all__ = [
    "BenchError",
    "BenchSetup",
    "descriptor_summary",
    "measure_exists",
    "run_bench",
    "screen",
]

Progress = Callable[[str], None]


class BenchError(KVCRPolicyError):
    """The benchmark cannot run as asked (memory, geometry, target)."""


@dataclass(frozen=True)
class BenchSetup:
    profile: str
    vs: str
    geometry: str = "qwen3-32b"
    layout: str = "layer_first"
    tokens: int = 8192
    repeat: int = 5
    mla: bool = False
    scatter: bool = False
    overrides: Mapping[str, Any] | None = None


def _fill(buffer: np.ndarray) -> None:
    """A pattern every page differs in, cheap to write (no random generator on GBs)."""
    words = buffer.view(np.uint64)
    chunk = 1 << 24
    for start in range(0, len(words), chunk):
        stop = min(start + chunk, len(words))
        words[start:stop] = np.arange(start, stop, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)


def _page_view(buffer: np.ndarray, geometry: PoolGeometry) -> np.ndarray:
    """(planes, pages, fragment bytes) view of a pool buffer: every layout reduces to it."""
    planes = geometry.fragments_per_page
    return buffer.reshape(planes, geometry.pages, geometry.fragment_bytes)


def _checksums(view: np.ndarray) -> np.ndarray:
    """One 64-bit checksum per page (sum of its 64-bit words with a per-position weight)."""
    planes, pages, nbytes = view.shape
    words = view.view(np.uint64).reshape(planes, pages, nbytes // 8)
    weights = np.arange(1, nbytes // 8 + 1, dtype=np.uint64) | np.uint64(1)
    out = np.zeros(pages, dtype=np.uint64)
    for plane in range(planes):  # per plane, vectorised over pages and words
        out += (words[plane] * weights).sum(axis=1, dtype=np.uint64)
    return out


def _keys(n: int, salt: str) -> list[str]:
    return [hashlib.sha256(f"{salt}:{i}".encode()).hexdigest() for i in range(n)]


def _load(profile: str, overrides: Mapping[str, Any], capacity: int) -> LoadedConfig:
    merged = {"placement.capacity_bytes": capacity, **overrides}
    return load_config(profile=profile, overrides=merged)


class _Side:
    """One profile's pipeline over the shared pool buffer, with its keys stored."""

    def __init__(self, name: str, loaded: LoadedConfig, geometry: PoolGeometry, buffer: Any):
        self.name = name
        self.loaded = loaded
        self.pipeline: Pipeline = build_pipeline(loaded)
        self.pipeline.register_pool("kv", geometry, buffer)

    def close(self) -> None:
        self.pipeline.close()


def _limit_gbps(side: _Side, geometry: PoolGeometry, half: int, nbytes: int) -> float:
    """One contiguous copy of ``nbytes`` through the side's own transport (same threads)."""
    start = time.perf_counter()
    side.pipeline.probe(nbytes)
    return nbytes / (time.perf_counter() - start) / 1e9


def run_bench(setup: BenchSetup, progress: Progress | None = None) -> dict[str, Any]:
    """Store ``tokens`` tokens, restore them with both profiles in both orders; verify all."""
    import torch

    say = progress or (lambda message: None)
    if setup.geometry not in PRESETS:
        names = ", ".join(PRESETS)
        raise BenchError(f"unknown geometry {setup.geometry!r}; presets: {names}")
    half_geometry = preset(setup.geometry, layout=setup.layout, tokens=setup.tokens, mla=setup.mla)  # type: ignore[arg-type]
    n_pages = half_geometry.pages
    geometry = half_geometry.with_tokens(2 * setup.tokens)
    nbytes = half_geometry.nbytes
    tensor = torch.empty(geometry.shape, dtype=getattr(torch, geometry.dtype))
    raw = tensor.view(torch.uint8).numpy().reshape(-1)
    say(f"filling {nbytes / 2**30:.2f} GiB of source pages")
    _fill(raw)
    view = _page_view(raw, geometry)
    expected = _checksums(view[:, :n_pages])

    # Source pages 0..n-1; destination pages n..2n-1 (scattered: a random permutation).
    src_pages = np.arange(n_pages, dtype=np.int64)
    dst_pages = n_pages + src_pages
    rng = np.random.default_rng(0)
    if setup.scatter:
        dst_pages = n_pages + rng.permutation(n_pages)
    page = geometry.page_size
    src_idx = (src_pages[:, None] * page + np.arange(page)).reshape(-1)
    dst_idx = (dst_pages[:, None] * page + np.arange(page)).reshape(-1)
    keys = _keys(n_pages, "bench")

    overrides = dict(setup.overrides or {})
    sides: dict[str, _Side] = {}
    results: dict[str, Any] = {}
    try:
        for label, profile in (("P", setup.profile), ("Q", setup.vs)):
            say(f"storing through {profile!r}")
            loaded = _load(profile, overrides, nbytes)
            side = _Side(profile, loaded, geometry, tensor)
            start = time.perf_counter()
            stored = side.pipeline.set(keys, src_idx)
            seconds = time.perf_counter() - start
            if not all(stored):
                raise BenchError(f"profile {profile!r} stored {sum(stored)} of {n_pages} pages")
            results[label] = {"store_gbps": nbytes / seconds / 1e9}
            sides[label] = side

        runs: list[dict[str, Any]] = []
        verified = True
        for rep in range(setup.repeat):
            for order in (("P", "Q"), ("Q", "P")):
                for label in order:
                    # The limit right before each restore: this machine's copy rate drifts
                    # (shared memory bandwidth), so each restore is compared with its moment.
                    limit = _limit_gbps(sides["P"], geometry, nbytes, nbytes)
                    side = sides[label]
                    view[:, n_pages:] = 0
                    start = time.perf_counter()
                    got = side.pipeline.get(keys, dst_idx)
                    seconds = time.perf_counter() - start
                    ok = all(got) and bool(np.array_equal(_checksums(view[:, dst_pages]), expected))
                    verified &= ok
                    runs.append(
                        {
                            "repeat": rep,
                            "order": ",".join(order),
                            "profile": side.name,
                            "side": label,
                            "restore_gbps": nbytes / seconds / 1e9,
                            "limit_gbps": limit,
                            "verified": ok,
                        }
                    )
                    say(f"{side.name}: {nbytes / seconds / 1e9:.2f} GB/s ({','.join(order)})")
        stats = {label: side.pipeline.stats().to_dict() for label, side in sides.items()}
        exists_rate = measure_exists(setup.profile, overrides)
    finally:
        for side in sides.values():
            side.close()

    def median(label: str, order: str | None = None, key: str = "restore_gbps") -> float:
        values = [
            r[key] for r in runs if r["side"] == label and (order is None or r["order"] == order)
        ]
        return statistics.median(values)

    for r in runs:
        r["ratio_to_limit"] = r["restore_gbps"] / r["limit_gbps"]
    limit = statistics.median(r["limit_gbps"] for r in runs)
    p, q = median("P"), median("Q")
    # Ratios are medians of ratios taken in the same moment: P over its own limit, P over the
    # Q run of the same repeat and order.
    pairs = {(r["repeat"], r["order"], r["side"]): r["restore_gbps"] for r in runs}
    speedups = [v / pairs[(k[0], k[1], "Q")] for k, v in pairs.items() if k[2] == "P"]
    by_order = {
        order: {
            "restore_gbps": median("P", order),
            "baseline_gbps": median("Q", order),
            "ratio_to_limit": median("P", order, "ratio_to_limit"),
            "baseline_ratio_to_limit": median("Q", order, "ratio_to_limit"),
        }
        for order in ("P,Q", "Q,P")
    }
    return {
        "target": "cpu",
        "geometry": setup.geometry,
        "layout": setup.layout,
        "mla": setup.mla,
        "tokens": setup.tokens,
        "pages": n_pages,
        "bytes": nbytes,
        "scatter": setup.scatter,
        "repeat": setup.repeat,
        "verified": verified,
        "limit_gbps": round(limit, 3),
        "restore_gbps": round(p, 3),
        "baseline_gbps": round(q, 3),
        "ratio_to_limit": round(median("P", key="ratio_to_limit"), 3),
        "baseline_ratio_to_limit": round(median("Q", key="ratio_to_limit"), 3),
        "speedup_vs_baseline": round(statistics.median(speedups), 3),
        "store_gbps": round(results["P"]["store_gbps"], 3),
        "baseline_store_gbps": round(results["Q"]["store_gbps"], 3),
        "exists_keys_per_s": round(exists_rate),
        "query_keys_per_s": round(exists_rate),
        "orders": by_order,
        "profiles": {
            "P": {"name": setup.profile, "path": sides["P"].loaded.profile},
            "Q": {"name": setup.vs, "path": sides["Q"].loaded.profile},
        },
        "descriptors": descriptor_summary(stats),
        "transport": stats["P"]["transport"],
        "runs": runs,
    }


def measure_exists(profile: str, overrides: Mapping[str, Any], keys: int = 100_000) -> float:
    """Keys per second of one ``exists`` over ``keys`` stored keys, through the pipeline."""
    geometry = PoolGeometry("kv", "page_first", 1, 1, 8, "float16", 1, keys)
    buffer = np.zeros(geometry.shape, dtype=np.float16)
    loaded = _load(profile, overrides, geometry.nbytes)
    names = _keys(keys, "exists")
    with build_pipeline(loaded) as pipeline:
        pipeline.register_pool("kv", geometry, buffer)
        pipeline.set(names, np.arange(keys))
        timings = []
        for _ in range(5):
            start = time.perf_counter()
            found = pipeline.exists(names)
            timings.append(time.perf_counter() - start)
            if found != keys:
                raise BenchError(f"exists found {found} of {keys} stored keys")
    return keys / statistics.median(timings)


def descriptor_summary(stats: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Descriptors before and after coalescing, batches and peak in flight, per profile."""
    return {
        label: {
            "before": s["descriptors_before"],
            "after": s["descriptors_after"],
            "batches": s["batches"],
            "peak_inflight_batches": s["peak_inflight_batches"],
        }
        for label, s in stats.items()
    }


def screen(result: dict[str, Any], percent: float) -> dict[str, Any]:
    """The regression screen: P's median more than ``percent`` below Q's in either order."""
    failed = []
    for order, figures in result["orders"].items():
        floor = figures["baseline_gbps"] * (1 - percent / 100)
        if figures["restore_gbps"] < floor:
            failed.append(order)
    return {"percent": percent, "passed": not failed, "failed_orders": failed}
