"""SGLang's tensor (v0) API over a pipeline: whole pages passed as tensors, staged by a flat pool.

SGLang's generic path hands a backend one flat tensor per page (``get_data_page(i, flat=True)``)
and asks it to fill dummy pages on reads. The pipeline only moves bytes between a registered
pool and its tier, so these tensors pass through a small staging buffer registered as a pool of
opaque pages (:func:`~kvcr_policy.integrations.sglang_pools.flat_geometry`): one copy in, one
copy out, in chunks of at most :data:`STAGING_BYTES`. The staging pool has its own tier region
and keys, apart from the zero-copy (v1/v2) pool; use ``interface_v1`` to avoid the extra copies.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Final, TypeGuard

import numpy as np
import torch

from ..pipeline import Pipeline
from .sglang_pools import Namespace, flat_geometry

__all__ = ["STAGING_BYTES", "FlatPages"]

log = logging.getLogger("kvcr_policy.integrations.sglang")

STAGING_BYTES: Final = 64 << 20
# SGLang 0.5.23 hicache_storage.STORAGE_BATCH_SIZE: pages per batched storage call.
MAX_STAGING_PAGES: Final = 128


class FlatPages:
    """Stores and restores page tensors of ``page_bytes`` bytes through pool ``name``."""

    def __init__(self, pipeline: Pipeline, name: str, page_bytes: int, namespace: Namespace):
        rows = max(1, min(MAX_STAGING_PAGES, STAGING_BYTES // page_bytes))
        self.name = name
        self.page_bytes = page_bytes
        self.namespace = namespace
        self.geometry = flat_geometry(name, page_bytes, rows)
        self._staging = np.zeros(self.geometry.shape, dtype=np.uint8)
        self._rows = self._staging.reshape(rows, page_bytes)
        self._pipeline = pipeline
        # One staging buffer, and SGLang's prefetch and backup threads call at once.
        self._lock = threading.Lock()
        pipeline.register_pool(name, self.geometry, self._staging)

    def _fits(self, tensor: object) -> TypeGuard[torch.Tensor]:
        if not isinstance(tensor, torch.Tensor):
            return False
        return tensor.numel() * tensor.element_size() == self.page_bytes

    def _row(self, row: int, like: torch.Tensor) -> torch.Tensor:
        """Staging row ``row`` viewed with the dtype and shape of ``like`` (no copy)."""
        return torch.from_numpy(self._rows[row]).view(like.dtype).view(like.shape)

    def set(self, keys: Sequence[str], values: Sequence[Any]) -> list[bool]:
        """Store ``values[i]`` under ``keys[i]``; True per key now present."""
        ok = [False] * len(keys)
        chunk = len(self._rows)
        with self._lock:
            for start in range(0, len(keys), chunk):
                picked: list[int] = []
                for i in range(start, min(start + chunk, len(keys))):
                    value = values[i] if i < len(values) else None
                    if not self._fits(value):
                        log.warning(
                            "v0 set of key %r: expected a tensor of %d bytes, got %s; not stored",
                            keys[i],
                            self.page_bytes,
                            _describe(value),
                        )
                        continue
                    self._row(len(picked), value).copy_(value)
                    picked.append(i)
                if not picked:
                    continue
                chosen = self.namespace.keys([keys[i] for i in picked])
                stored = self._pipeline.set(chosen, np.arange(len(picked)), self.name)
                for i, good in zip(picked, stored, strict=True):
                    ok[i] = good
        return ok

    def get(self, keys: Sequence[str], targets: Sequence[Any] | None) -> list[torch.Tensor | None]:
        """Restore ``keys`` into ``targets`` (new uint8 tensors where None); None per miss.

        Stops at the first miss: SGLang uses only the leading run of pages.
        """
        out: list[torch.Tensor | None] = [None] * len(keys)
        chunk = len(self._rows)
        with self._lock:
            for start in range(0, len(keys), chunk):
                stop = min(start + chunk, len(keys))
                dests = []
                for i in range(start, stop):
                    target = targets[i] if targets is not None and i < len(targets) else None
                    if target is None:
                        target = torch.empty(self.page_bytes, dtype=torch.uint8)
                    if not self._fits(target):
                        log.warning(
                            "v0 get of key %r: target must hold %d bytes, got %s; miss",
                            keys[i],
                            self.page_bytes,
                            _describe(target),
                        )
                        return out
                    dests.append(target)
                got = self._pipeline.get(
                    self.namespace.keys(keys[start:stop]), np.arange(stop - start), self.name
                )
                for j, good in enumerate(got):
                    if not good:
                        return out
                    dests[j].copy_(self._row(j, dests[j]))
                    out[start + j] = dests[j]
        return out

    def exists(self, keys: Sequence[str]) -> int:
        """How many of ``keys`` from the start are stored."""
        return self._pipeline.exists(self.namespace.keys(keys), self.name)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        nbytes = value.numel() * value.element_size()
        return f"{tuple(value.shape)} {value.dtype} ({nbytes} bytes)"
    return type(value).__name__
