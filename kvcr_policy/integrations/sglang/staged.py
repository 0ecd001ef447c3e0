"""A host pool moved through a staging buffer: the generic path for layouts we do not model.

The pipeline moves bytes between a registered buffer and the tier by geometry. A pool whose
layout kvcr_policy does not model (:mod:`.access`) is therefore given a stand-in: a staging
buffer of opaque pages (:func:`~kvcr_policy.geometry.opaque`) registered under the pool's name.
A store gathers the pool's pages into staging rows and stores the rows; a restore reads rows and
scatters them into the pool's pages. One copy more than the zero-copy path, never a byte the
pool did not list.

The buffer is a :class:`~kvcr_policy.backends.staging.StagingArea` of two slots, so SGLang's
prefetch and backup threads still run side by side (a third call waits for a slot); a call
larger than a slot is cut into chunks of at most :data:`STAGING_BYTES`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Final

import numpy as np
import torch

from ...backends.staging import StagingArea
from ...geometry import PoolGeometry, key_pages, opaque
from ...pipeline import Pipeline
from .access import PageAccess

__all__ = ["STAGING_BYTES", "StagedPool"]

#: Bytes of each of the two slots of a staging buffer.
STAGING_BYTES: Final = 32 << 20
# SGLang 0.5.23 hicache_storage.STORAGE_BATCH_SIZE: pages per batched storage call.
MAX_ROWS: Final = 128


def _indices(token_indices: Any) -> torch.Tensor:
    if isinstance(token_indices, torch.Tensor):
        return token_indices.detach().to("cpu", torch.int64).reshape(-1)
    return torch.as_tensor(np.asarray(token_indices), dtype=torch.int64).reshape(-1)


class StagedPool:
    """Stores and restores the pages of one host pool through ``access`` and a staging buffer."""

    def __init__(
        self, pipeline: Pipeline, name: str, access: PageAccess, tokens: int | None
    ) -> None:
        self.name = name
        self.access = access
        page_bytes = access.page_bytes
        self.rows = max(1, min(MAX_ROWS, STAGING_BYTES // page_bytes))
        self.geometry = opaque(name, page_bytes, 2 * self.rows)
        # Validates token indices as a kv pool of the same page size and token count would
        # (a pool that gives no count: bounded by the memory check of every piece instead).
        self.indices = PoolGeometry(
            name=name, layout="page_first", layers=1, heads=1, head_dim=1, dtype="uint8",
            page_size=access.page_size, tokens=tokens or access.page_size << 40, mla=True,
        )  # fmt: skip
        self.area = StagingArea(f"pool {name!r}", page_bytes, 2, self.rows)
        self._pipeline = pipeline
        pipeline.register_pool(name, self.geometry, self.area.buffer.reshape(self.geometry.shape))

    @property
    def page_bytes(self) -> int:
        return self.access.page_bytes

    def _pages(self, keys: Sequence[str], token_indices: Any) -> torch.Tensor:
        indices = _indices(token_indices)
        key_pages(self.indices, keys, indices)  # one page of token indices per key
        return indices

    @contextmanager
    def _slot(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """A slot of the staging area for one call: its rows in the stand-in pool, its bytes."""
        taken = self.area.take(1, wait=True)
        assert taken is not None  # waited for
        try:
            yield self.area.slot_rows(taken[0]), self.area.slot_bytes(taken[0])
        finally:
            self.area.give(taken)

    def _parts(self, count: int) -> Iterator[tuple[int, int]]:
        """``[start, stop)`` of each part of a call of ``count`` keys: a slot's rows at most."""
        return ((start, min(start + self.rows, count)) for start in range(0, count, self.rows))

    def set(self, keys: Sequence[str], token_indices: Any) -> list[bool]:
        """Store the pages at ``token_indices`` under ``keys``; True per key now stored."""
        indices = self._pages(keys, token_indices)
        size, done = self.access.page_size, [False] * len(keys)
        with self._slot() as (rows, staging):
            for start, stop in self._parts(len(keys)):
                self.access.gather(indices[start * size : stop * size], staging)
                stored = self._pipeline.set(keys[start:stop], rows[: stop - start], self.name)
                done[start:stop] = [bool(x) for x in stored]
        return done

    def get(self, keys: Sequence[str], token_indices: Any) -> list[bool]:
        """Restore ``keys`` into the pages at ``token_indices``; only the leading run arrives."""
        indices = self._pages(keys, token_indices)
        size, done = self.access.page_size, [False] * len(keys)
        with self._slot() as (rows, staging):
            for start, stop in self._parts(len(keys)):
                got = self._pipeline.get(keys[start:stop], rows[: stop - start], self.name)
                lead = next((i for i, ok in enumerate(got) if not ok), stop - start)
                if lead:
                    self.access.scatter(indices[start * size : (start + lead) * size], staging)
                    done[start : start + lead] = [True] * lead
                if lead < stop - start:
                    break
        return done

    def exists(self, keys: Sequence[str]) -> int:
        return self._pipeline.exists(list(keys), self.name)
