"""Measuring the link limit for a plan: the configured backend's largest single move.

A real pipeline is opened with the profile's placement and transport (its tier shrunk to the
bytes measured, so a 512 GiB profile does not map 512 GiB here), one pool is registered, and
:meth:`~kvcr_policy.pipeline.Pipeline.probe` moves the bytes tier -> pool; the best of a few
runs is the limit, as the benchmark measures it.
"""

from __future__ import annotations

import time
from dataclasses import replace

from pydantic import ByteSize

from ..config.loading import LoadedConfig
from ..geometry import PoolGeometry
from ..pipeline import build_pipeline

__all__ = ["measure_link"]


def measure_link(loaded: LoadedConfig, geometry: PoolGeometry, nbytes: int, runs: int = 3) -> float:
    """GB/s of the best of ``runs`` probes of about ``nbytes`` (whole pages, at least one)."""
    import torch

    pages = max(1, nbytes // geometry.page_bytes)
    pool_geometry = replace(geometry, tokens=pages * geometry.page_size)
    config = loaded.config
    placement = config.placement.model_copy(
        update={"capacity_bytes": ByteSize(pool_geometry.nbytes)}
    )
    observability = config.observability.model_copy(update={"metrics": False})
    shrunk = config.model_copy(update={"placement": placement, "observability": observability})
    with build_pipeline(replace(loaded, config=shrunk)) as pipeline:
        buffer = torch.zeros(pool_geometry.shape, dtype=getattr(torch, geometry.dtype))
        pipeline.register_pool("kv", pool_geometry, buffer)
        best = float("inf")
        for _ in range(runs):
            start = time.perf_counter()
            pipeline.probe(pool_geometry.nbytes)
            best = min(best, time.perf_counter() - start)
    return pool_geometry.nbytes / best / 1e9
