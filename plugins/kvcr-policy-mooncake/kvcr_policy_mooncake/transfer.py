"""MooncakeRead and MooncakeWrite: one get or set on one :class:`~.pool.MooncakePool`, cut
into store calls.

Each call moves at most ``call_pages`` pages, straight between pool memory and the segments
(the batch calls of :mod:`.objects`), or through the pool's staging area (:mod:`.staging`);
what each key's result code means is in :mod:`.pool`.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import ClassVar, Protocol

import numpy as np

from kvcr_policy.plugin_api import CapacityError, PoolGeometry, Shape, TransportError

from .client import StoreClient
from .codes import STORED, Code, describe, is_master_down
from .objects import ObjectPlan
from .staging import StagedBatch, Staging

__all__ = ["MooncakeRead", "MooncakeTransfer", "MooncakeWrite", "Pool"]

_ABSENT = frozenset({Code.OBJECT_NOT_FOUND, Code.REPLICA_IS_NOT_READY})
#: Read codes that are misses, not failures to retry: absent, or a segment that did not answer.
_MISSED_READ = _ABSENT | {Code.TRANSFER_FAIL}
#: The code a page not asked reads as, by why: misses, and for a set, not stored (no retry).
_SKIPPED_AS = {
    "calls_refused": Code.RPC_FAIL,
    "calls_past_deadline": Code.RPC_TIMEOUT,
    "calls_after_transfer_fail": Code.TRANSFER_FAIL,
}
#: Write codes that are pages not stored, not failures to retry: an unfinished object that an
#: upsert could not replace (:meth:`MooncakeTransfer._confirmed`).
_NOT_STORED = frozenset({Code.REPLICA_IS_NOT_READY})


class Pool(Protocol):
    """What a transfer uses of its :class:`~.pool.MooncakePool` (which imports this module: the
    protocol keeps the two apart)."""

    name: str
    geometry: PoolGeometry
    client: StoreClient
    plan: ObjectPlan
    staging: Staging | None
    call_pages: int
    op_timeout_s: float
    counters: Counter[str]

    def run(
        self, work: Callable[[np.ndarray], np.ndarray], positions: np.ndarray
    ) -> Future[np.ndarray]: ...

    def contains(self, keys: Sequence[str]) -> int: ...

    def moving(self) -> AbstractContextManager[object]: ...

    def count_codes(self, call: str, codes: Sequence[int]) -> None: ...


class MooncakeTransfer:
    """One get or set on one pool (:class:`MooncakeRead`, :class:`MooncakeWrite`): each batch's
    store calls (and, staged, its scatters) have finished when the batch's future resolves, so
    nothing is held between batches and :meth:`abort` has nothing to undo."""

    #: A get (``batch_get_into`` into the pool) or a set (``batch_put_from`` from it).
    read: ClassVar[bool]

    def __init__(self, pool: Pool, keys: list[str], pages: np.ndarray) -> None:
        self.pool = pool
        self.keys = keys
        self.pages = pages
        self.objects = pool.plan.keys(keys)
        self.deadline = time.monotonic() + pool.op_timeout_s
        #: The first position whose page a segment failed to send: later ones are not asked.
        self.dead_from = len(keys)
        self._lock = threading.Lock()  # batches of one transfer run on several threads
        self.limit = len(keys)

    def _skipped(self, part: np.ndarray) -> str | None:
        """Why the pages of ``part`` are missed without a store call, if they are."""
        if not self.pool.client.health.allows():
            return "calls_refused"  # the master is down
        if time.monotonic() > self.deadline:
            return "calls_past_deadline"
        if self.read and int(part[0]) >= self.dead_from:
            return "calls_after_transfer_fail"
        return None

    def _call(self, positions: np.ndarray) -> list[int]:
        """The store calls of ``positions`` (at most ``call_pages`` pages each, one after
        another); pages not asked (see :meth:`_skipped`) read as misses (``_SKIPPED_AS``)."""
        pool = self.pool
        codes: list[int] = []
        staged = None if pool.staging is None else StagedBatch(pool.staging)
        try:
            self._calls(positions, codes, staged)
        finally:
            if staged is not None:  # the batch's pages are in the pool when it returns
                staged.close()
        return codes

    def _store_call(
        self, objects: list[str], pages: np.ndarray, staged: StagedBatch | None
    ) -> list[int]:
        pool = self.pool
        if staged is not None:
            move = staged.get if self.read else staged.put
            return move(objects, pages.tolist())
        pointers, sizes = pool.plan.buffers(pages)
        if self.read:
            return pool.client.get(objects, pointers, sizes, pool.plan.multi)
        return pool.client.put(objects, pointers, sizes, pool.plan.multi)

    def _confirmed(self, objects: list[str], pages: np.ndarray, codes: list[int]) -> list[int]:
        """The codes of a put, with a page counted stored only once ``exists`` says so.

        Mooncake answers 0 to a put of a key whose earlier put never finished (its writer died
        between put start and put end; the master keeps the unfinished object until
        ``--put_start_discard_timeout_sec``, 30 s by default) and stores nothing: every read
        misses it. Such an object is replaced by an upsert from the pool's memory; a page still
        absent after that is not stored (``REPLICA_IS_NOT_READY``). One ``batch_is_exist`` per
        put call (two where a page was unfinished), whose lease holds the new objects as a
        read's does (``--default_kv_lease_ttl``)."""
        pool = self.pool
        asked = [i for i, code in enumerate(codes) if code == 0]
        if not asked:
            return codes
        present = pool.client.exists([objects[i] for i in asked])
        stale = [i for i, found in zip(asked, present, strict=True) if found == 0]
        if not stale:
            return codes
        pool.counters["set_unfinished"] += len(stale)
        keys = [objects[i] for i in stale]
        pointers, sizes = pool.plan.buffers(pages[stale])
        pool.client.upsert(keys, pointers, sizes, pool.plan.multi)
        out = list(codes)
        for i, found in zip(stale, pool.client.exists(keys), strict=True):
            if found == 1:
                pool.counters["set_replaced"] += 1
            else:
                out[i] = int(Code.REPLICA_IS_NOT_READY)
        return out

    def _calls(self, positions: np.ndarray, codes: list[int], staged: StagedBatch | None) -> None:
        pool = self.pool
        for start in range(0, len(positions), pool.call_pages):
            part = positions[start : start + pool.call_pages]
            skipped = self._skipped(part)
            if skipped is not None:
                pool.counters[skipped] += 1
                codes += [int(_SKIPPED_AS[skipped])] * (len(positions) - start)
                break
            objects = [self.objects[p] for p in part.tolist()]
            with pool.moving():
                got = self._store_call(objects, self.pages[part], staged)
                if not self.read:
                    got = self._confirmed(objects, self.pages[part], got)
            pool.counters["get_calls" if self.read else "set_calls"] += 1
            pool.count_codes("get" if self.read else "set", got)
            codes += got
            failed = [int(p) for p, c in zip(part, got, strict=True) if c == Code.TRANSFER_FAIL]
            if self.read and failed:
                with self._lock:
                    self.dead_from = min(self.dead_from, failed[0])

    def _judge(self, codes: list[int]) -> np.ndarray:
        if self.read:
            return self._judge_read(codes)
        return self._judge_write(codes)

    def _judge_read(self, codes: list[int]) -> np.ndarray:
        page_bytes = self.pool.geometry.page_bytes
        arrived = np.array([code == page_bytes for code in codes], dtype=bool)
        failed = [
            c for c in codes if c != page_bytes and c not in _MISSED_READ and not is_master_down(c)
        ]
        if failed:
            # A stale exists (a dead holder's keys stay listed for client_ttl) then a failed
            # get: the fallback retries page by page and only pages that arrive count.
            message = f"Mooncake get failed for {len(failed)} of {len(codes)} pages: "
            raise TransportError(message + ", ".join(sorted({describe(c) for c in failed})))
        return arrived

    def _judge_write(self, codes: list[int]) -> np.ndarray:
        stored = np.array([code in STORED for code in codes], dtype=bool)
        if not stored.any() and Code.NO_AVAILABLE_HANDLE in codes:
            message = (
                f"Mooncake Store has no room for {len(codes)} pages of pool "
                f"{self.pool.name!r} ({describe(Code.NO_AVAILABLE_HANDLE)}): every segment is "
                "full of pages under a lease or not yet evicted; add segments "
                "(backend.options.segment_bytes on more clients) or wait for eviction"
            )
            raise CapacityError(message)
        failed = [c for c in codes if c not in STORED and not is_master_down(c)]
        failed = [c for c in failed if c != Code.NO_AVAILABLE_HANDLE and c not in _NOT_STORED]
        if Code.TENANT_NOT_REGISTERED in failed:
            tenant = self.pool.plan.tenant
            message = (
                f"Mooncake refused to store pages of tenant {tenant!r} "
                f"({describe(Code.TENANT_NOT_REGISTERED)}): the master enforces tenants and its "
                "tenant quota policy does not name this one; add it there, or set "
                "backend.options.tenant to a tenant it names"
            )
            raise TransportError(message)
        if failed:
            message = f"Mooncake put failed for {len(failed)} of {len(codes)} pages: "
            raise TransportError(message + ", ".join(sorted({describe(c) for c in failed})))
        return stored

    def _move(self, positions: np.ndarray) -> np.ndarray:
        return self._judge(self._call(positions))

    def submit(self, positions: np.ndarray, shape: Shape) -> Future[np.ndarray]:
        # No descriptors to shape: each page is one object, gathered or scattered in place.
        return self.pool.run(self._move, positions)

    def finish(self, moved: np.ndarray) -> list[bool]:
        result = [False] * len(self.keys)
        result[: self.limit] = [bool(x) for x in moved[: self.limit]]
        return result

    def abort(self) -> None:
        """Nothing to undo: each batch was one call, complete when it returned."""


class MooncakeRead(MooncakeTransfer):
    """One get: it covers the leading run present now, one ``batch_is_exist`` whose lease keeps
    those objects from eviction and removal while the batches read them (the claim)."""

    read = True
    miss = "absent"

    def __init__(self, pool: Pool, keys: list[str], pages: np.ndarray) -> None:
        super().__init__(pool, keys, pages)
        self.limit = pool.contains(keys)


class MooncakeWrite(MooncakeTransfer):
    """One set: every key put (the keys are distinct, backends.base: all move)."""

    read = False
    needs: np.ndarray | None = None
    miss = "claimed"
