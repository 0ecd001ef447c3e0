"""SGLang's tensor (v0) API: whole objects under keys, given as tensors or as pointers.

Two forms of the same four calls (``set``, ``get``, ``batch_set``, ``batch_get``) reach here:

- tensor form: ``value`` / ``target_location`` is a CPU tensor holding one page (SGLang's
  generic path hands a backend ``get_data_page(i, flat=True)`` and a dummy page to fill);
- pointer form: ``target_location`` is an address (or a list of addresses) and
  ``target_sizes`` the byte count (or list), as Mooncake's store takes them. Every address must
  lie in the memory of a registered host pool (:class:`.memory.MemoryMap`), as Mooncake requires
  its buffers registered.

An object is the concatenation of its pieces. Objects of one size share one pool of opaque pages
of that size (:func:`~kvcr_policy.geometry.opaque`), staged through a small buffer: one copy in,
one copy out, in chunks of at most :data:`STAGING_BYTES`. So a page stored as a tensor can be
restored through a pointer and back. At most :data:`MAX_SIZES` sizes get a pool each (each has
its own tier region).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from ...backends.host_copy import copy_descriptors
from ...descriptors import Descriptors
from ...errors import ArgumentError
from ...geometry import opaque
from ...pipeline import Pipeline
from .pools import Namespace

__all__ = ["MAX_SIZES", "STAGING_BYTES", "FlatObjects", "FlatPages", "Pieces"]

log = logging.getLogger("kvcr_policy.integrations.sglang")

STAGING_BYTES: Final = 64 << 20
# SGLang 0.5.23 hicache_storage.STORAGE_BATCH_SIZE: pages per batched storage call.
MAX_STAGING_PAGES: Final = 128
#: Distinct object sizes the tensor API keeps a pool for.
MAX_SIZES: Final = 8

Int64Array = npt.NDArray[np.int64]
#: One object's pieces: (addresses, sizes), int64 arrays of one length.
Pieces = tuple[Int64Array, Int64Array]


class FlatPages:
    """Objects of ``page_bytes`` bytes stored and restored through pool ``name``."""

    def __init__(self, pipeline: Pipeline, name: str, page_bytes: int, namespace: Namespace):
        rows = max(1, min(MAX_STAGING_PAGES, STAGING_BYTES // page_bytes))
        self.name = name
        self.page_bytes = page_bytes
        self.namespace = namespace
        self.geometry = opaque(name, page_bytes, rows)
        self._staging = np.zeros(self.geometry.shape, dtype=np.uint8)
        self._address = int(self._staging.__array_interface__["data"][0])
        self._rows = rows
        self._pipeline = pipeline
        # One staging buffer, and SGLang's prefetch and backup threads call at once.
        self._lock = threading.Lock()
        pipeline.register_pool(name, self.geometry, self._staging)

    def _plan(self, objects: Sequence[Pieces]) -> tuple[Int64Array, Int64Array, Int64Array]:
        """(addresses, staging offsets, sizes) of every piece of ``objects``, row by row."""
        addresses = np.concatenate([o[0] for o in objects])
        sizes = np.concatenate([o[1] for o in objects])
        offsets = []
        for row, (_, lengths) in enumerate(objects):
            offsets.append(row * self.page_bytes + np.cumsum(lengths) - lengths)
        return addresses, np.concatenate(offsets), sizes

    def set(self, keys: Sequence[str], objects: Sequence[Pieces]) -> list[bool]:
        """Store ``objects[i]`` under ``keys[i]``; True per key now present."""
        ok = [False] * len(keys)
        with self._lock:
            for start in range(0, len(keys), self._rows):
                stop = min(start + self._rows, len(keys))
                addresses, offsets, sizes = self._plan(objects[start:stop])
                plan = Descriptors.from_arrays(addresses, offsets, sizes)
                copy_descriptors(self._address, 0, plan)
                chosen = self.namespace.keys(keys[start:stop])
                stored = self._pipeline.set(chosen, np.arange(stop - start), self.name)
                ok[start:stop] = [bool(x) for x in stored]
        return ok

    def get(self, keys: Sequence[str], objects: Sequence[Pieces]) -> list[bool]:
        """Restore ``keys`` into ``objects``; stops at the first miss (SGLang uses the leading
        run)."""
        ok = [False] * len(keys)
        with self._lock:
            for start in range(0, len(keys), self._rows):
                stop = min(start + self._rows, len(keys))
                chosen = self.namespace.keys(keys[start:stop])
                got = self._pipeline.get(chosen, np.arange(stop - start), self.name)
                lead = next((i for i, good in enumerate(got) if not good), stop - start)
                if lead:
                    addresses, offsets, sizes = self._plan(objects[start : start + lead])
                    plan = Descriptors.from_arrays(offsets, addresses, sizes)
                    copy_descriptors(0, self._address, plan)
                    ok[start : start + lead] = [True] * lead
                if lead < stop - start:
                    break
        return ok

    def exists(self, keys: Sequence[str]) -> int:
        """How many of ``keys`` from the start are stored."""
        return self._pipeline.exists(self.namespace.keys(keys), self.name)


class FlatObjects:
    """Every size's :class:`FlatPages`, opened on first use."""

    def __init__(self, pipeline: Pipeline, namespace: Callable[[str, int], Namespace]) -> None:
        self._pipeline = pipeline
        self._namespace = namespace
        self._pools: dict[int, FlatPages] = {}
        self._lock = threading.Lock()

    def pool(self, nbytes: int, *, create: bool = True) -> FlatPages | None:
        pages = self._pools.get(nbytes)
        if pages is not None or not create:
            return pages
        with self._lock:
            if nbytes not in self._pools:
                if len(self._pools) >= MAX_SIZES:
                    message = (
                        f"tensor API: an object of {nbytes} bytes would need a {MAX_SIZES + 1}th "
                        f"object size (kept: {sorted(self._pools)}); each size has its own tier "
                        "region, so store objects of fewer sizes (whole pages)"
                    )
                    raise ArgumentError(message)
                name = f"v0.{nbytes}"
                self._pools[nbytes] = FlatPages(
                    self._pipeline, name, nbytes, self._namespace(name, nbytes)
                )
                log.info("kvcr_policy: tensor API objects of %d bytes: pool %r", nbytes, name)
        return self._pools[nbytes]

    def _grouped(self, objects: Sequence[Pieces]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for i, (_, sizes) in enumerate(objects):
            groups.setdefault(int(sizes.sum()), []).append(i)
        return groups

    def set(self, keys: Sequence[str], objects: Sequence[Pieces]) -> list[bool]:
        """Store ``objects[i]`` under ``keys[i]``, leaving out (reported stored) the keys a
        lookup of their size's pool declined: they are in the tier (:mod:`...declined`)."""
        ok = [False] * len(keys)
        declined = self._pipeline.admission.declined
        for nbytes, where in self._grouped(objects).items():
            pages = self.pool(nbytes)
            assert pages is not None
            noted = declined.split(pages.name, [keys[i] for i in where])
            if noted is not None:
                for i, skip in zip(where, noted, strict=True):
                    ok[i] = skip
                where = [i for i, skip in zip(where, noted, strict=True) if not skip]
                if not where:
                    continue
            done = pages.set([keys[i] for i in where], [objects[i] for i in where])
            for i, good in zip(where, done, strict=True):
                ok[i] = good
        return ok

    def get(self, keys: Sequence[str], objects: Sequence[Pieces]) -> list[bool]:
        """Restore the leading run of ``keys`` present; False from the first miss on."""
        ok = [False] * len(keys)
        start = 0
        while start < len(keys):
            nbytes = int(objects[start][1].sum())
            stop = start
            while stop < len(keys) and int(objects[stop][1].sum()) == nbytes:
                stop += 1
            pages = self.pool(nbytes, create=False)
            if pages is None:
                break
            done = pages.get(keys[start:stop], objects[start:stop])
            ok[start:stop] = done
            if not all(done):
                break
            start = stop
        return ok

    def has(self, key: str) -> bool:
        return any(pages.exists([key]) == 1 for pages in list(self._pools.values()))

    def exists(self, keys: Sequence[str], nbytes: int | None = None) -> int:
        """Leading ``keys`` stored as objects of ``nbytes`` bytes (any size when None)."""
        if nbytes is not None:
            pages = self.pool(nbytes, create=False)
            return pages.exists(keys) if pages is not None else 0
        return next((i for i, key in enumerate(keys) if not self.has(key)), len(keys))
