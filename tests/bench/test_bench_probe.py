"""Pipeline.probe: the one public method every limit goes through (dram tier here).

The tier mirrors the pool's layout with slots in place of pages, so after pages 0..n-1 are
stored into a tier of exactly n slots, the tier's bytes are the pool's: a probe of every
byte must then give the pool back what was wiped from it.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcr_policy.config.loading import load_config
from kvcr_policy.errors import ClosedError, IndicesError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.pipeline import Pipeline, build_pipeline

GEOMETRY = PoolGeometry("kv", "page_first", 2, 2, 8, "uint8", 4, 32)  # 8 pages of 256 B


def open_pipeline(profile: str = "throughput") -> tuple[Pipeline, np.ndarray]:
    loaded = load_config(profile, environ={}, overrides={"placement.capacity_bytes": 2048})
    pipeline = build_pipeline(loaded)
    buffer = np.random.default_rng(3).integers(0, 256, GEOMETRY.shape, dtype=np.uint8)
    pipeline.register_pool("kv", GEOMETRY, buffer)
    return pipeline, buffer


@pytest.mark.parametrize("profile", ["default", "throughput"])
def test_probe_moves_the_tiers_first_bytes_into_the_pools(profile: str) -> None:
    pipeline, buffer = open_pipeline(profile)
    with pipeline:
        original = buffer.copy()
        keys = [f"k{i}" for i in range(8)]
        assert all(pipeline.set(keys, np.arange(32)))
        buffer[...] = 0
        pipeline.probe(1000)
        flat, want = buffer.reshape(-1), original.reshape(-1)
        assert np.array_equal(flat[:1000], want[:1000])
        assert not flat[1000:].any()  # nothing past nbytes moved
        assert pipeline.exists(keys) == 8


def test_probe_refuses_what_does_not_fit_and_after_close() -> None:
    pipeline, _ = open_pipeline()
    with pytest.raises(IndicesError, match=r"probe of 4096 bytes does not fit.*probe at most 2048"):
        pipeline.probe(4096)
    with pytest.raises(IndicesError, match="positive number of bytes"):
        pipeline.probe(0)
    pipeline.close()
    with pytest.raises(ClosedError, match="probe"):
        pipeline.probe(16)
