"""MooncakePool: one registered pool on Mooncake Store; the :class:`PoolTier` of ``mooncake``.

The mover drives it like any backend: one ``batch_is_exist`` per metadata-query batch (and one
per get, for the leading present run it reads), and each batch of a get or set on a worker
thread, so the delivery window bounds real store calls in flight: zero-copy batch calls
(:mod:`.objects`), or calls through the pool's staging area (:mod:`.staging`), of at most
``call_pages`` pages each, as many as the transport's queue holds (:mod:`.client`); the calls
themselves are :mod:`.transfer`'s, the limit probe :mod:`.probe`'s. What each key's result
code means:

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
- set: 0 or OBJECT_ALREADY_EXISTS -> present (a present key keeps its first value), once
  ``batch_is_exist`` confirms it: Mooncake also answers 0 for a key whose earlier put never
  finished (its writer died mid-put), and stores nothing; such an object is replaced by an
  upsert, and a page that is still absent is not stored
  (:meth:`.transfer.MooncakeTransfer._confirmed`);
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
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import numpy as np

from kvcr_policy.plugin_api import ClosedError, IndicesError, PoolSpec, TransportError

from .client import StoreClient
from .codes import describe
from .objects import ObjectPlan
from .probe import Prober
from .staging import Staging
from .transfer import MooncakeRead, MooncakeWrite

__all__ = ["MooncakePool"]

log = logging.getLogger("kvcr_policy_mooncake.pool")

Run = Callable[[Callable[[np.ndarray], np.ndarray], np.ndarray], "Future[np.ndarray]"]


class MooncakePool:
    """See the module docstring; made by :meth:`MooncakeBackend.attach`."""

    def __init__(
        self,
        spec: PoolSpec,
        client: StoreClient,
        run: Run,
        call_buffers: int,
        op_timeout_s: float,
        connect: Callable[[], StoreClient],
        staging: Staging | None = None,
    ) -> None:
        self.name = spec.name
        self.op_timeout_s = op_timeout_s
        self.geometry = spec.geometry
        self.endpoint = spec.endpoint
        self.client = client
        self.run = run
        tenant = client.options.tenant
        self.plan = ObjectPlan(spec.name, spec.geometry, spec.endpoint.address, tenant)
        self.call_buffers = call_buffers
        # Pages per store call: a page's fragments always travel together; staged, a page is
        # one buffer and a call fills one slot of the staging area.
        self.staging = staging
        self.call_pages = max(1, call_buffers // spec.geometry.fragments_per_page)
        if staging is not None:
            self.call_pages = min(staging.slot_pages, call_buffers)
        self.counters: Counter[str] = Counter()
        self._cond = threading.Condition()
        self._active = 0  # this pool's batches running now
        self._flushing = False
        self.prober = Prober(self.plan, spec.endpoint.nbytes, call_buffers, connect)
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

    def read(self, keys: list[str], pages: np.ndarray) -> MooncakeRead:
        self._check_open("get")
        return MooncakeRead(self, keys, pages)

    def write(self, keys: list[str], pages: np.ndarray) -> MooncakeWrite:
        self._check_open("set")
        return MooncakeWrite(self, keys, pages)

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
            self.prober.forget()
        finally:
            with self._cond:
                self._flushing = False
                self._cond.notify_all()

    def probe(self, nbytes: int) -> None:
        """One ``batch_get_into`` of ``nbytes`` into the pool's first bytes, on a client of
        its own (:mod:`.probe` says what it moves, and why not on the pool's client)."""
        self._check_open("probe")
        room = self.endpoint.nbytes
        if nbytes > room:
            message = (
                f"pool {self.name!r}: probe of {nbytes} bytes does not fit the pool "
                f"({room} bytes); probe at most {room}"
            )
            raise IndicesError(message)
        with self.moving():
            self.prober.probe(nbytes)

    def stats(self) -> dict[str, Any]:
        return {
            "page_bytes": self.geometry.page_bytes,
            "namespace": self.plan.namespace,
            "calls": self.calls,
            "call_pages": self.call_pages,
            "staging": None if self.staging is None else self.staging.describe(),
            "probe_client": None if self.prober.client is None else self.prober.client.hostname,
            "counters": dict(self.counters),
        }

    @property
    def calls(self) -> str:
        """How pages move: ``staged`` (:mod:`.staging`), ``multi_buffers`` or ``single_buffer``."""
        if self.staging is not None:
            return "staged"
        return "multi_buffers" if self.plan.multi else "single_buffer"

    def audit(self) -> dict[str, Any] | None:
        return None  # segment memory is allocated and placed by Mooncake, not by us

    def close(self) -> None:
        """After every batch finished (the backend waited): drop this client's probe objects
        and unregister the pool memory (and its staging area)."""
        if self._closed:
            return
        self._closed = True
        if self.staging is not None:
            self.staging.close()
        self.prober.close()
        code = self.client.unregister(self.endpoint.address)
        if code != 0:
            log.warning("pool %r: unregistering its memory returned %s", self.name, describe(code))
