"""The pipeline rig of ``tests/test_pipeline.py`` and ``tests/test_mover.py``: small pools, a
``build`` fixture (pipelines closed after the test), layout cases and byte comparisons."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import pytest

from kvcr_policy.backends.dram.transports.base import CopyBatch
from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.config.loading import load_config
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.pipeline import Pipeline, build_pipeline
from kvcr_policy.registry import Registry
from tests.support import pools
from tests.support.pools import (
    P,
    copy_buffer,
    keys_of,
    page_slice,
    random_buffer,
    raw_bytes,
    token_indices,
)

__all__ = [
    "CAPACITY",
    "LAYOUT_CASES",
    "LAYOUT_IDS",
    "MHA_CASES",
    "MLA_CASES",
    "Build",
    "TrackingTransport",
    "after_restore",
    "build",
    "expected_planes",
    "geometry",
    "indices_for",
    "keep_switch_interval",
    "kind_dtype",
    "pool_pages",
    "same_bytes",
    "store_stats",
    "stored_pool",
]

CAPACITY = "1MiB"  # tier bytes per pool unless a test says otherwise

MHA_CASES = [("layer_first", False), ("page_first", False), ("page_first_direct", False)]
MHA_CASES += [("page_head", False)]
MLA_CASES = [("layer_first", True), ("page_first", True), ("page_first_direct", True)]
LAYOUT_CASES = MHA_CASES + MLA_CASES
LAYOUT_IDS = [f"{'mla' if mla else 'mha'}-{layout}" for layout, mla in LAYOUT_CASES]

Build = Callable[..., Pipeline]


#: This file's pools: 3 layers, 2 heads (1 for MLA), head dim 8, page size 4, 16 pages.
geometry = partial(pools.geometry, pages=16, head_dim=8)


def expected_planes(layout: str, mla: bool, layers: int = 3) -> int:
    """Contiguous fragments per page (DESIGN.md): 2·L in layer_first, else 2; half for MLA."""
    halves = 1 if mla else 2
    return halves * (layers if layout == "layer_first" else 1)


def kind_dtype(kind: str) -> str:
    return "bfloat16" if kind.startswith("torch") else "float16"


def indices_for(kind: str, pages: Sequence[int]) -> Any:
    """Token indices as the engine would pass them: a torch tensor for torch pools."""
    array = token_indices(pages, P)
    if kind.startswith("torch"):
        import torch

        return torch.from_numpy(array)
    return array


def same_bytes(a: object, b: object) -> bool:
    return bool(np.array_equal(raw_bytes(a), raw_bytes(b)))


def after_restore(
    before: object, original: object, geo: PoolGeometry, pairs: Sequence[tuple[int, int]]
) -> object:
    """``before`` with page ``dst`` replaced by page ``src`` of ``original`` for each pair."""
    expected = copy_buffer(before)
    for src, dst in pairs:
        expected[page_slice(geo, int(dst))] = original[page_slice(geo, int(src))]  # type: ignore[index]
    return expected


def store_stats(pipeline: Pipeline, pool: str = "kv") -> dict[str, int]:
    return pipeline.stats().pools[pool]["store"]


@pytest.fixture(autouse=True)
def keep_switch_interval() -> Iterator[None]:
    """A failing test must not leave another test with a changed switch interval."""
    previous = sys.getswitchinterval()
    yield
    sys.setswitchinterval(previous)


@pytest.fixture
def build(registry: Registry) -> Iterator[Build]:
    """``build(profile, overrides, transport=None)``: a pipeline closed after the test.

    ``environ={}`` keeps the developer's ``KVCR_POLICY_*`` variables out; the tier is small.
    """
    made: list[Pipeline] = []

    def make(
        profile: str = "default",
        overrides: Mapping[str, Any] | None = None,
        *,
        transport: Any = None,
    ) -> Pipeline:
        loaded = load_config(
            profile,
            environ={},
            overrides={"placement.capacity_bytes": CAPACITY, **(overrides or {})},
            registry=registry,
        )
        pipeline = build_pipeline(loaded, transport=transport)
        made.append(pipeline)
        return pipeline

    yield make
    for pipeline in made:
        pipeline.close()


def stored_pool(
    build: Build,
    profile: str = "default",
    overrides: Mapping[str, Any] | None = None,
    *,
    n: int = 8,
    transport: Any = None,
    seed: int = 0,
) -> tuple[Pipeline, PoolGeometry, np.ndarray, np.ndarray, list[str]]:
    """A pipeline with a numpy pool whose pages 0..n-1 are stored under k0..k(n-1).

    Returns the pipeline, the geometry, the pool buffer, a copy of it as stored, and the keys.
    """
    geo = geometry(pages=32)
    rng = np.random.default_rng(seed)
    buf = random_buffer(geo, rng, "numpy-float16")
    pipeline = build(profile, overrides, transport=transport)
    pipeline.register_pool("kv", geo, buf)
    keys = keys_of("k", n)
    assert pipeline.set(keys, token_indices(range(n), P)) == [True] * n
    return pipeline, geo, buf, copy_buffer(buf), keys  # type: ignore[return-value]


def pool_pages(batch: CopyBatch, geo: PoolGeometry, buffer: object) -> set[int]:
    """The pool pages a batch reads or writes (the pool is whichever side is ``buffer``)."""
    d = batch.descriptors
    offsets = d.dst if batch.dst.buffer is buffer else d.src
    first = (offsets % geo.plane_bytes) // geo.fragment_bytes
    last = ((offsets + d.length - 1) % geo.plane_bytes) // geo.fragment_bytes
    return {
        page for a, b in zip(first.tolist(), last.tolist(), strict=True) for page in range(a, b + 1)
    }


class TrackingTransport(MemoryTransport):
    """Holds batches of the gated pool pages until ``gate`` opens; counts finished copies."""

    def __init__(self, gated: set[int], geo: PoolGeometry) -> None:
        super().__init__()
        self.gated, self.geo, self.buffer = gated, geo, None
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.finished = 0
        self.lock = threading.Lock()

    def copy(self, batch: CopyBatch) -> None:
        if pool_pages(batch, self.geo, self.buffer) & self.gated:
            self.entered.set()
            assert self.gate.wait(10), "the test never opened the gate"
        super().copy(batch)
        with self.lock:
            self.finished += 1
