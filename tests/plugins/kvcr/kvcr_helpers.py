"""KVCR spies and stored pools shared by the ``kvcr`` backend tests (pools and keys come from
:mod:`tests.support.pools`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.pipeline import Pipeline
from tests.support.pools import P, fresh_keys, geometry, pool_buffer, token_indices


def pool_tier(pipeline: Pipeline, name: str = "kv") -> Any:
    """The backend's pool object (a KvcrPool)."""
    return pipeline._pools[name][1]


def kvcr_of(pipeline: Pipeline, name: str = "kv") -> Any:
    """The ``kvcr.api.KVCR`` instance serving pool ``name``."""
    return pool_tier(pipeline, name).runner.kvcr


@dataclass
class Calls:
    """What a spy saw: per KVCR method, the number of blocks or keys of each call, and the
    most operations of each kind that were in flight at once."""

    sizes: dict[str, list[int]] = field(default_factory=dict)
    in_flight: int = 0
    peak: int = 0


@contextmanager
def spy(kvcr: Any) -> Iterator[Calls]:
    """Record every deliver/deposit/query/fetch call into ``kvcr`` and how many data
    operations (deliver, deposit) were in flight, as KVCR itself reports their completion."""
    calls = Calls()
    lock = threading.Lock()
    data_handles: set[int] = set()
    originals = {name: getattr(kvcr, name) for name in ("deliver", "deposit", "query", "fetch")}
    poll = kvcr.poll_completed

    def wrap(name: str) -> Any:
        def call(blocks: Any, *args: Any, **kwargs: Any) -> Any:
            result = originals[name](blocks, *args, **kwargs)
            with lock:
                calls.sizes.setdefault(name, []).append(len(blocks))
                if name in ("deliver", "deposit"):
                    data_handles.add(int(result))
                    calls.in_flight += 1
                    calls.peak = max(calls.peak, calls.in_flight)
            return result

        return call

    def poll_completed() -> Any:
        done = list(poll())
        with lock:
            for handle, _ in done:
                if int(handle) in data_handles:
                    data_handles.discard(int(handle))
                    calls.in_flight -= 1
        return done

    for name in originals:
        setattr(kvcr, name, wrap(name))
    kvcr.poll_completed = poll_completed
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(kvcr, name, original)
        kvcr.poll_completed = poll


def stored(pipeline: Pipeline, n: int = 12, geo: PoolGeometry | None = None, seed: int = 0) -> Any:
    """Register pool ``kv`` (random bytes) and store its first ``n`` pages under fresh keys."""
    geo = geo or geometry()
    buffer = pool_buffer(geo, seed)
    pipeline.register_pool("kv", geo, buffer)
    keys = fresh_keys(n)
    assert pipeline.set(keys, token_indices(range(n), P)) == [True] * n
    return geo, buffer, keys
