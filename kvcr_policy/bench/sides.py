"""The comparison axis: the sides of a run, and P against profile Q.

A side is one thing that stores pages and restores them into the run's pool: a profile's
pipeline on the run's backend, or a peer implementation (:mod:`.hicache`). A comparison opens
the pool and both sides; the runner drives them all the same way.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Mapping
from contextlib import ExitStack
from typing import Any

import numpy as np

from ..config.loading import LoadedConfig, load_config
from ..geometry import PoolGeometry
from ..pipeline import build_pipeline
from .plan import Plan, Side
from .setup import BenchError
from .targets import Pool, tokens_of

__all__ = ["ProfileComparison", "ProfileSide", "bench_keys", "exists_rate", "side_overrides"]


def bench_keys(n: int, salt: str) -> list[str]:
    """``n`` keys shaped like SGLang's (sha256 hex digests)."""
    return [hashlib.sha256(f"{salt}:{i}".encode()).hexdigest() for i in range(n)]


def side_overrides(plan: Plan, started: Mapping[str, Any], label: str = "P") -> dict[str, Any]:
    """A side's overrides: the target's, then the backend instance's, then ``--set``, then
    (for Q) ``--vs-set``."""
    only_q = (plan.setup.vs_overrides or {}) if label == "Q" else {}
    return {**plan.target.overrides, **started, **(plan.setup.overrides or {}), **only_q}


class ProfileSide:
    """One profile's pipeline on the run's backend, with the run's pool registered as ``kv``."""

    def __init__(self, label: str, loaded: LoadedConfig, name: str, pool: Pool) -> None:
        self.label, self.name, self.path = label, name, loaded.profile
        self.pipeline = build_pipeline(loaded)
        try:
            self.pipeline.register_pool("kv", pool.geometry, pool.tensor)
        except BaseException:
            self.pipeline.close()
            raise

    def store(self, keys: list[str], tokens: np.ndarray) -> bool:
        return all(self.pipeline.set(keys, tokens))

    def restore(self, keys: list[str], tokens: np.ndarray) -> bool:
        return all(self.pipeline.get(keys, tokens))


class ProfileComparison:
    """P against profile Q (``--vs``): each its own pipeline and backend instance."""

    baseline = "Q"

    def check(self, plan: Plan) -> None:
        return None

    def open(self, stack: ExitStack, plan: Plan) -> tuple[Pool, dict[str, Side]]:
        pool = plan.target.open(plan.measured)
        sides: dict[str, Side] = {}
        for label, profile in (("P", plan.setup.profile), ("Q", plan.setup.vs)):
            started = stack.enter_context(plan.backend.start(label, profile, plan.measured))
            loaded = load_config(profile=profile, overrides=side_overrides(plan, started, label))
            side = ProfileSide(label, loaded, profile, pool)
            stack.callback(side.pipeline.close)
            sides[label] = side
        return pool, sides

    def describe(self) -> dict[str, Any]:
        return {}


def exists_rate(plan: Plan, label: str, profile: str, repeat: int = 5) -> float:
    """Keys per second of one ``exists`` over ``plan.setup.exists_keys`` stored keys.

    Asked of a fresh backend instance holding a small pool of one-byte pages on the target
    (in host memory, or on the GPU for ``cuda``, whose profiles may name the cuda transport),
    median of ``repeat`` queries. Its pipeline records no metrics (``observability.metrics``
    false): its one-byte pages and lookups are not the benchmark's traffic, and would skew
    ``kvcr_policy_pages_total`` against ``kvcr_policy_bytes_total``.
    """
    n = plan.setup.exists_keys
    geometry, buffer = plan.target.metadata_pool(
        PoolGeometry("kv", "page_first", 1, 1, 8, "uint8", 1, n)
    )
    keys = bench_keys(n, "exists")
    with plan.backend.start(f"{label} exists", profile, geometry) as started:
        only_q = (plan.setup.vs_overrides or {}) if label == "Q" else {}
        overrides = {
            **plan.target.overrides,
            **started,
            **(plan.setup.overrides or {}),
            **only_q,
            "observability.metrics": False,
        }
        with build_pipeline(load_config(profile=profile, overrides=overrides)) as pipeline:
            pipeline.register_pool("kv", geometry, buffer)
            stored = pipeline.set(keys, tokens_of(1, np.arange(n, dtype=np.int64)))
            if not all(stored):
                raise BenchError(f"{profile!r} stored {sum(stored)} of {n} metadata keys")
            timings = []
            for _ in range(repeat):
                start = time.perf_counter()
                found = pipeline.exists(keys)
                timings.append(time.perf_counter() - start)
                if found != n:
                    raise BenchError(f"exists found {found} of {n} stored keys ({profile!r})")
    return n / statistics.median(timings)
