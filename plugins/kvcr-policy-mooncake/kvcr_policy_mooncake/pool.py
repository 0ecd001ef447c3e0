"""MooncakePool: one registered pool on Mooncake Store; the :class:`PoolTier` of ``mooncake``.

The mover drives it like any backend: one ``batch_is_exist`` per metadata-query batch (and one
per get, for the leading present run it reads), and each batch of a get or set on a worker
thread, so the delivery window bounds real store calls in flight: zero-copy batch calls
(:mod:`.objects`) of at most ``call_pages`` pages each, as many as the transport's queue holds
(:mod:`.client`). What each key's result code means:

- get: the page's size in bytes -> arrived; OBJECT_NOT_FOUND or not ready -> absent (the run
  ends there); master down -> a miss (the health state opens); TRANSFER_FAIL (the segment
  holding the page did not answer: its client died, while exists still says present for
  ``client_ttl``) -> a miss, and every later page of the same get is missed without a store
  call: a read uses only the leading run, and each call to a dead segment waits out a tcp
  connect (0.45 s a page was measured when such pages were retried one by one); any other code
  fails the batch, and the fallback strategy retries it page by page: only pages that arrived
  count.
- every call: once ``transport.op_timeout_s`` has passed since the get or set began, its
  remaining pages are missed (not stored) without a store call, so a whole call ends within
  that bound plus the one store call under way.
- set: 0 or OBJECT_ALREADY_EXISTS -> present (a present key keeps its first value);
  NO_AVAILABLE_HANDLE on every key of a batch -> CapacityError (the store is full: nothing
  more fits); master down -> not stored.

Every get and exists grants the object a lease (``default_kv_lease_ttl`` on the master, 10 s by
default): while it runs the object is neither evicted nor removed, which is what keeps a page
being read from being overwritten. :meth:`MooncakePool.delete` respects leases;
:meth:`MooncakePool.clear` is a flush of the pool's objects, leases or not, once this
process's own batches of the pool have finished.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import numpy as np

from kvcr_policy.plugin_api import (
    CapacityError,
    ClosedError,
    IndicesError,
    PoolSpec,
    Shape,
    TransportError,
)

from .client import StoreClient
from .codes import Code, describe, is_master_down
from .objects import ObjectPlan

__all__ = ["MooncakePool"]

log = logging.getLogger("kvcr_policy_mooncake.pool")

Run = Callable[[Callable[[np.ndarray], np.ndarray], np.ndarray], "Future[np.ndarray]"]
_ABSENT = frozenset({Code.OBJECT_NOT_FOUND, Code.REPLICA_IS_NOT_READY})
#: Read codes that are misses, not failures to retry: absent, or a segment that did not answer.
_MISSED_READ = _ABSENT | {Code.TRANSFER_FAIL}
#: The code a page not asked reads as, by why: misses, and for a set, not stored (no retry).
_SKIPPED_AS = {
    "calls_refused": Code.RPC_FAIL,
    "calls_past_deadline": Code.RPC_TIMEOUT,
    "calls_after_transfer_fail": Code.TRANSFER_FAIL,
}
_STORED = frozenset({0, Code.OBJECT_ALREADY_EXISTS})


class MooncakePool:
    """See the module docstring; made by :meth:`MooncakeBackend.attach`."""

    def __init__(
        self,
        spec: PoolSpec,
        client: StoreClient,
        run: Run,
        call_buffers: int,
        op_timeout_s: float = 30.0,
    ) -> None:
        self.name = spec.name
        self.op_timeout_s = op_timeout_s
        self.geometry = spec.geometry
        self.endpoint = spec.endpoint
        self.client = client
        self.run = run
        self.plan = ObjectPlan(spec.name, spec.geometry, spec.endpoint.address)
        self.call_buffers = call_buffers
        # Pages per store call: a page's fragments always travel together.
        self.call_pages = max(1, call_buffers // spec.geometry.fragments_per_page)
        self.counters: Counter[str] = Counter()
        self._cond = threading.Condition()
        self._active = 0  # this pool's batches running now
        self._flushing = False
        self._probes: set[str] = set()
        self._closed = False

    # ---- guarded calls ---------------------------------------------------------------------

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise ClosedError(f"mooncake pool {self.name!r} is closed: {call}() refused")

    @contextmanager
    def moving(self) -> Any:
        """One batch of this pool running; a flush waits for it (and new ones for the flush)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._flushing)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def count_codes(self, call: str, codes: Sequence[int]) -> None:
        for code in codes:
            if code < 0:
                self.counters[f"{call}:{describe(code)}"] += 1

    # ---- PoolTier ------------------------------------------------------------------------

    def contains(self, keys: Sequence[str]) -> int:
        """Leading keys present: one ``batch_is_exist``; a master that is down is a miss."""
        self._check_open("exists")
        if not keys:
            return 0
        if not self.client.health.allows():
            self.counters["exists_refused"] += 1
            return 0
        codes = self.client.exists(self.plan.keys(list(keys)))
        self.counters["exists_calls"] += 1
        self.count_codes("exists", codes)
        found = 0
        for code in codes:
            if code != 1:
                break
            found += 1
        return found

    def begin(self, read: bool, keys: list[str], pages: np.ndarray) -> _Transfer:
        self._check_open("get" if read else "set")
        return _Transfer(self, read, keys, pages)

    def delete(self, keys: Sequence[str]) -> int:
        """Remove ``keys``; an object under a lease (a recent get or exists) stays."""
        self._check_open("delete")
        if not keys or not self.client.health.allows():
            return 0
        codes = self.client.remove(self.plan.keys(list(keys)))
        self.count_codes("delete", codes)
        return sum(1 for code in codes if code == 0)

    def clear(self) -> None:
        """Flush every object of this pool from the store (leases or not), once this
        process's running batches of the pool have finished."""
        self._check_open("clear")
        if not self.client.health.allows():
            raise TransportError(
                f"pool {self.name!r}: clear() needs the Mooncake master "
                f"{self.client.health.where}, which is unreachable ({self.client.health.reason})"
            )
        with self._cond:
            self._flushing = True
            self._cond.wait_for(lambda: self._active == 0)
        try:
            self.counters["cleared_objects"] += self.client.remove_matching(self.plan.pattern)
            self._probes.clear()
        finally:
            with self._cond:
                self._flushing = False
                self._cond.notify_all()

    def probe(self, nbytes: int) -> None:
        """One ``batch_get_into`` of ``nbytes`` into the pool's first bytes: as many page-sized
        objects as the bytes make (whole multiples of a page if one call could not hold that
        many: ``call_buffers``), stored by the first probe of that size (so placed by the
        master as pages are), read back in one call into contiguous pool memory."""
        self._check_open("probe")
        room = self.endpoint.nbytes
        if nbytes > room:
            message = (
                f"pool {self.name!r}: probe of {nbytes} bytes does not fit the pool "
                f"({room} bytes); probe at most {room}"
            )
            raise IndicesError(message)
        # Page-sized objects; whole multiples of a page where one call would hold too many.
        page = self.geometry.page_bytes
        pages = -(-nbytes // page)  # rounded up
        piece = page * -(-pages // self.call_buffers)  # pages per object, so one call holds all
        sizes = [piece] * (nbytes // piece) + ([nbytes % piece] if nbytes % piece else [])
        starts = np.concatenate(([0], np.cumsum(sizes[:-1]))).astype(np.int64)
        pointers = (self.endpoint.address + starts).tolist()
        keys = [self.plan.probe_key(self.client.hostname, nbytes, i) for i in range(len(sizes))]
        with self.moving():
            if keys[0] not in self._probes:
                codes = self.client.put(keys, pointers, sizes, multi=False)
                failed = sorted({describe(c) for c in codes if c not in _STORED})
                if failed:
                    message = f"pool {self.name!r}: storing the {nbytes}-byte probe failed: "
                    raise TransportError(message + ", ".join(failed))
                self._probes.update(keys)
            codes = self.client.get(keys, pointers, sizes, multi=False)
        if codes != sizes:
            self._probes.difference_update(keys)
            failed = sorted({describe(c) for c, n in zip(codes, sizes, strict=True) if c != n})
            message = f"pool {self.name!r}: the {nbytes}-byte probe read "
            raise TransportError(message + ", ".join(failed))

    def stats(self) -> dict[str, Any]:
        return {
            "page_bytes": self.geometry.page_bytes,
            "namespace": self.plan.namespace,
            "calls": "multi_buffers" if self.plan.multi else "single_buffer",
            "call_pages": self.call_pages,
            "counters": dict(self.counters),
        }

    def audit(self) -> dict[str, Any] | None:
        return None  # segment memory is allocated and placed by Mooncake, not by us

    def close(self) -> None:
        """After every batch finished (the backend waited): drop this client's probe objects
        and unregister the pool memory."""
        if self._closed:
            return
        self._closed = True
        if self._probes and self.client.health.allows():
            self.client.remove(sorted(self._probes), force=True)
        code = self.client.unregister(self.endpoint.address)
        if code != 0:
            log.warning("pool %r: unregistering its memory returned %s", self.name, describe(code))


class _Transfer:
    """One get or set on one pool: every batch is one store call on its own, so nothing is
    held between batches and :meth:`abort` has nothing to undo."""

    def __init__(self, pool: MooncakePool, read: bool, keys: list[str], pages: np.ndarray) -> None:
        self.pool = pool
        self.read = read
        self.keys = keys
        self.pages = pages
        self.objects = pool.plan.keys(keys)
        self.deadline = time.monotonic() + pool.op_timeout_s
        #: The first position whose page a segment failed to send: later ones are not asked.
        self.dead_from = len(keys)
        self._lock = threading.Lock()  # batches of one transfer run on several threads
        # A read covers the leading run present now: one batch_is_exist, whose lease keeps
        # those objects from eviction and removal while the batches read them (the claim).
        self.limit = pool.contains(keys) if read else len(keys)
        self.needs: np.ndarray | None = None  # the keys are distinct (backends.base): all

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
        for start in range(0, len(positions), pool.call_pages):
            part = positions[start : start + pool.call_pages]
            skipped = self._skipped(part)
            if skipped is not None:
                pool.counters[skipped] += 1
                codes += [int(_SKIPPED_AS[skipped])] * (len(positions) - start)
                break
            objects = [self.objects[p] for p in part.tolist()]
            pointers, sizes = pool.plan.buffers(self.pages[part])
            with pool.moving():
                if self.read:
                    got = pool.client.get(objects, pointers, sizes, pool.plan.multi)
                else:
                    got = pool.client.put(objects, pointers, sizes, pool.plan.multi)
            pool.counters["get_calls" if self.read else "set_calls"] += 1
            pool.count_codes("get" if self.read else "set", got)
            codes += got
            failed = [int(p) for p, c in zip(part, got, strict=True) if c == Code.TRANSFER_FAIL]
            if self.read and failed:
                with self._lock:
                    self.dead_from = min(self.dead_from, failed[0])
        return codes

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
        stored = np.array([code in _STORED for code in codes], dtype=bool)
        if not stored.any() and Code.NO_AVAILABLE_HANDLE in codes:
            message = (
                f"Mooncake Store has no room for {len(codes)} pages of pool "
                f"{self.pool.name!r} ({describe(Code.NO_AVAILABLE_HANDLE)}): every segment is "
                "full of pages under a lease or not yet evicted; add segments "
                "(backend.options.segment_bytes on more clients) or wait for eviction"
            )
            raise CapacityError(message)
        failed = [c for c in codes if c not in _STORED and not is_master_down(c)]
        failed = [c for c in failed if c != Code.NO_AVAILABLE_HANDLE]
        if failed:
            message = f"Mooncake put failed for {len(failed)} of {len(codes)} pages: "
            raise TransportError(message + ", ".join(sorted({describe(c) for c in failed})))
        return stored

    def _move(self, positions: np.ndarray) -> np.ndarray:
        return self._judge(self._call(positions))

    def submit(self, positions: np.ndarray, shape: Shape) -> Future[np.ndarray]:
        # No descriptors to shape: each page is one object, gathered or scattered in place.
        return self.pool.run(self._move, positions)

    def retry(self, position: int) -> bool:
        return bool(self._move(np.array([position]))[0])

    def finish(self, moved: np.ndarray) -> list[bool]:
        result = [False] * len(self.keys)
        result[: self.limit] = [bool(x) for x in moved[: self.limit]]
        return result

    def abort(self) -> None:
        """Nothing to undo: each batch was one call, complete when it returned."""
