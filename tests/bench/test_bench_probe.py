"""Pipeline.probe and Pipeline.probe_store: the public methods every limit goes through (dram
tier here).

The tier mirrors the pool's layout with slots in place of pages, so after pages 0..n-1 are
stored into a tier of exactly n slots, the tier's bytes are the pool's: a probe of every
byte must then give the pool back what was wiped from it.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvcr_policy.config.loading import load_config
from kvcr_policy.errors import ClosedError, IndicesError, UnsupportedError
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


def test_probe_store_moves_the_pools_first_bytes_into_the_emptied_tier() -> None:
    pipeline, buffer = open_pipeline()
    with pipeline:
        original = buffer.copy()
        pipeline.probe_store(2048)  # the whole tier: every slot now holds the pool's bytes
        buffer[...] = 0
        pipeline.probe(2048)
        assert np.array_equal(buffer, original)
        assert pipeline.exists([f"k{i}" for i in range(8)]) == 0  # it stored nothing


def test_probe_store_refuses_while_the_tier_holds_a_page_and_loses_nothing() -> None:
    pipeline, buffer = open_pipeline()
    with pipeline:
        assert pipeline.set(["k0"], np.arange(4)) == [True]
        buffer[...] = 0
        assert pipeline.get(["k0"], np.arange(4)) == [True]
        stored = buffer.copy()
        assert stored.any()
        buffer[...] = 7
        with pytest.raises(IndicesError, match=r"store probe: 1 of the tier's 8 slots are stored"):
            pipeline.probe_store(1000)
        buffer[...] = 0
        assert pipeline.get(["k0"], np.arange(4)) == [True]
        assert np.array_equal(buffer, stored)  # the stored page is as it was
        pipeline.clear()
        pipeline.probe_store(1000)  # emptied: taken


def test_probe_store_refuses_what_does_not_fit_and_a_backend_without_one() -> None:
    pipeline, _ = open_pipeline()
    with pipeline, pytest.raises(IndicesError, match=r"probe_store of 4096 bytes does not fit"):
        pipeline.probe_store(4096)
    # The example plugin's dict backend has a restore probe and no store probe: bench
    # reports no store limit for it (None), and the call says why.
    loaded = load_config(
        "throughput",
        environ={},
        overrides={"backend.name": "dict", "placement.capacity_bytes": 2048},
    )
    with build_pipeline(loaded) as other:
        other.register_pool("kv", GEOMETRY, np.zeros(GEOMETRY.shape, dtype=np.uint8))
        with pytest.raises(UnsupportedError, match="has no probe_store"):
            other.probe_store(16)
