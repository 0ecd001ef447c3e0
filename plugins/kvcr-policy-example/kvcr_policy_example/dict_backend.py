"""``dict``: a tier backend that keeps each page as ``bytes`` in a Python dict.

An example of the tier-backend seam for plugin authors (and the third backend the pipeline's
behavioural tests run against): it implements :class:`kvcr_policy.backends.base.TierBackend`
without any of kvcr_policy's own tier code. It has no region of its own to copy descriptors
into, so it declares no descriptor capabilities (``coalescing.on_unsupported`` decides what a
coalescing profile does with it) and copies each page fragment by fragment.

It keeps the seam's promises: a read claims its pages, and a claimed page is never evicted or
overwritten until the read releases it; a write publishes only pages that arrived; batches run
on ``threads`` worker threads, so delivery windows bound something real; ``fail_every`` makes
every N-th batch of several pages fail after its first page (the fallback strategy then submits
its pages again one by one); close waits for every batch, and calls after it raise
``ClosedError``. A read and a write are two small classes (:class:`_Read`, :class:`_Write`).
"""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kvcr_policy.plugin_api import (
    BackendContext,
    CapacityError,
    ClosedError,
    PoolSpec,
    Shape,
    TransportError,
    build_descriptors,
    check_device,
    hookimpl,
)

if TYPE_CHECKING:
    from kvcr_policy.plugin_api import RegisterBackend

__all__ = ["DictBackend", "DictOptions", "kvcr_register_backends"]


class DictOptions(BaseModel):
    """``[backend.options]`` of the ``dict`` backend; unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    capacity_pages: int = Field(
        1024, gt=0, le=1 << 24, description="Pages held per pool before eviction (1..16777216)."
    )
    threads: int = Field(2, gt=0, le=64, description="Worker threads moving batches (1..64).")
    fail_every: int | None = Field(
        None, gt=0, le=1 << 20, description="Fail every N-th batch after its first page (tests)."
    )


@dataclass
class _Page:
    data: bytearray
    claims: int = 0


class _Batches:
    """What a get and a set share: each batch's pages moved one by one on the backend's
    threads (every ``fail_every``-th batch of several pages fails after its first page)."""

    def __init__(self, pool: _DictPool, keys: list[str], pages: np.ndarray) -> None:
        self.pool, self.keys, self.pages = pool, keys, pages
        self.limit = len(keys)

    def _page(self, position: int) -> None:
        raise NotImplementedError

    def _run(self, positions: np.ndarray, fail: bool) -> np.ndarray:
        for i, position in enumerate(positions.tolist()):
            if fail and i == 1:
                raise TransportError("dict backend: injected failure (fail_every)")
            self._page(position)
        return np.ones(len(positions), dtype=bool)

    def submit(self, positions: np.ndarray, shape: Shape) -> Future[np.ndarray]:
        return self.pool.backend.run(self._run, positions)


class _Read(_Batches):
    """One get: the leading present keys claimed (never evicted until :meth:`finish`)."""

    miss = "absent"

    def __init__(self, pool: _DictPool, keys: list[str], pages: np.ndarray) -> None:
        super().__init__(pool, keys, pages)
        self.held = pool.claim(keys)
        self.limit = len(self.held)

    def _page(self, position: int) -> None:
        pool = self.pool
        data = pool.pages[self.keys[position]].data
        for src, dst, n in pool.fragments(int(self.pages[position])):
            ctypes.memmove(pool.address + dst, (ctypes.c_char * n).from_buffer(data, src), n)

    def finish(self, moved: np.ndarray) -> list[bool]:
        self.pool.release(self.held)
        result = [False] * len(self.keys)
        result[: self.limit] = moved.tolist()
        return result

    def abort(self) -> None:
        self.pool.release(self.held)


class _Write(_Batches):
    """One set: each page copied out of the pool, published at :meth:`finish` if it arrived."""

    needs: np.ndarray | None = None
    miss = "claimed"

    def __init__(self, pool: _DictPool, keys: list[str], pages: np.ndarray) -> None:
        super().__init__(pool, keys, pages)
        self.staged: dict[int, bytearray] = {}

    def _page(self, position: int) -> None:
        pool = self.pool
        data = bytearray(pool.page_bytes)
        for src, dst, n in pool.fragments(int(self.pages[position])):
            ctypes.memmove((ctypes.c_char * n).from_buffer(data, src), pool.address + dst, n)
        self.staged[position] = data

    def finish(self, moved: np.ndarray) -> list[bool]:
        result = [False] * len(self.keys)
        for position in np.flatnonzero(moved).tolist():
            result[position] = self.pool.publish(self.keys[position], self.staged[position])
        return result

    def abort(self) -> None:
        """Nothing published: the copies are dropped with this object."""


class _DictPool:
    def __init__(self, backend: DictBackend, spec: PoolSpec, capacity: int) -> None:
        self.backend = backend
        self.name = spec.name
        self.address = spec.endpoint.address
        self.page_bytes = spec.geometry.page_bytes
        self.capacity = capacity
        # A one-page geometry: a stored page's bytes laid out as in the pool.
        self.single = replace(
            spec.geometry, name=f"{spec.name}.page", tokens=spec.geometry.page_size
        )
        self.geometry = spec.geometry
        self.pages: OrderedDict[str, _Page] = OrderedDict()
        self.lock = threading.Lock()
        self.evictions = 0

    def fragments(self, page: int) -> list[tuple[int, int, int]]:
        """(offset in the stored page, offset in the pool, length) of each fragment."""
        d = build_descriptors(self.single, [0], self.geometry, [page])
        return list(zip(d.src.tolist(), d.dst.tolist(), d.length.tolist(), strict=True))

    def claim(self, keys: Sequence[str]) -> list[str]:
        held: list[str] = []
        with self.lock:
            for key in keys:
                page = self.pages.get(key)
                if page is None:
                    break
                page.claims += 1
                self.pages.move_to_end(key)
                held.append(key)
        return held

    def release(self, keys: Sequence[str]) -> None:
        with self.lock:
            for key in keys:
                page = self.pages.get(key)
                if page is not None:
                    page.claims -= 1

    def publish(self, key: str, data: bytearray) -> bool:
        with self.lock:
            present = self.pages.get(key)
            if present is not None:
                return True  # a set of a present key succeeds without rewriting it
            while len(self.pages) >= self.capacity:
                victim = next((k for k, p in self.pages.items() if p.claims == 0), None)
                if victim is None:
                    raise CapacityError(
                        f"dict backend: pool {self.name!r} is full of claimed pages"
                    )
                del self.pages[victim]
                self.evictions += 1
            self.pages[key] = _Page(data)
            return True

    def contains(self, keys: Sequence[str]) -> int:
        with self.lock:
            count = 0
            for key in keys:
                if key not in self.pages:
                    break
                count += 1
            return count

    def read(self, keys: list[str], pages: np.ndarray) -> _Read:
        return _Read(self, keys, pages)

    def write(self, keys: list[str], pages: np.ndarray) -> _Write:
        return _Write(self, keys, pages)

    def delete(self, keys: Sequence[str]) -> int:
        with self.lock:
            gone = [k for k in keys if k in self.pages and self.pages[k].claims == 0]
            for key in gone:
                del self.pages[key]
            return len(gone)

    def clear(self) -> None:
        with self.lock:
            for key in [k for k, p in self.pages.items() if p.claims == 0]:
                del self.pages[key]

    def probe(self, nbytes: int) -> None:
        ctypes.memset(self.address, 0, min(nbytes, self.geometry.nbytes))

    def stats(self) -> dict[str, Any]:
        with self.lock:
            claimed = sum(1 for p in self.pages.values() if p.claims)
            return {"keys": len(self.pages), "claimed": claimed, "evictions": self.evictions}

    def audit(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        with self.lock:
            self.pages.clear()


class DictBackend:
    """The ``dict`` backend; see the module docstring."""

    name = "dict"
    capabilities: frozenset[str] = frozenset()
    devices = frozenset({"cpu"})

    def __init__(self, context: BackendContext, options: DictOptions) -> None:
        self.options = options
        self._executor = ThreadPoolExecutor(options.threads, thread_name_prefix="kvcr-dict")
        self._pools: list[_DictPool] = []
        self._lock = threading.Lock()
        self._batches = 0
        self._failable = 0  # batches of several pages: every fail_every-th of them fails
        self._closed = False

    def run(self, work: Any, positions: np.ndarray) -> Future[np.ndarray]:
        with self._lock:
            if self._closed:
                raise ClosedError("backend 'dict' is closed; build a new pipeline")
            self._batches += 1
            every = self.options.fail_every
            if every is not None and len(positions) > 1:  # a page submitted alone never fails
                self._failable += 1
            fail = every is not None and len(positions) > 1 and self._failable % every == 0
            return self._executor.submit(work, positions, fail)

    def attach(self, spec: PoolSpec) -> _DictPool:
        check_device(spec, self.devices, "backend 'dict'")
        pool = _DictPool(self, spec, self.options.capacity_pages)
        with self._lock:
            if self._closed:
                raise ClosedError("backend 'dict' is closed; build a new pipeline")
            self._pools.append(pool)
        return pool

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "capabilities": [], "batches": self._batches}

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._executor.shutdown(wait=True)  # every batch finished before pages go
        for pool in self._pools:
            pool.close()


@hookimpl
def kvcr_register_backends(register: RegisterBackend) -> None:
    register("dict", DictBackend, options=DictOptions, description="pages as bytes in a dict")
