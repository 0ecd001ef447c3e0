"""One get (:class:`DramRead`) or set (:class:`DramWrite`) on one pool of the ``dram`` backend:
the claim or reservation it holds, the batches it submits to the copy transport, and what a
read reads ahead.

A read claims the slots of its leading present run for the whole call, lets the transport read
ahead of its first batch (:meth:`.Transport.read_ahead`), and forgets that before it releases
the claim; a write reserves slots and publishes exactly the pages that arrived, each batch's as
it lands (:meth:`.Store.publish`), the rest when it finishes.

The read-ahead may start before the call is validated and claimed (:class:`EarlyRead`, from
:meth:`.backend.DramPool.read_early`): it reads the slots the keys had then, and the claim
adopts it only where it found the same slots with the same generations, so the same bytes;
otherwise the read reads ahead anew.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from ...descriptors import build_descriptors, slot_descriptors
from ...geometry import PoolGeometry
from ..base import Endpoint, Shape
from .store import Claim, Reservation, Store
from .transports.base import CopyBatch, Transport

log = logging.getLogger("kvcr_policy.backends.dram")

__all__ = ["DramRead", "DramWrite", "EarlyRead", "Side", "read_early"]


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a pool's copies: its endpoint and layout."""

    endpoint: Endpoint
    geometry: PoolGeometry


class Pool(Protocol):
    """What a transfer uses of its pool (:class:`.backend.DramPool`)."""

    name: str
    geometry: PoolGeometry
    store: Store
    transport: Transport
    pool_side: Side
    tier_side: Side
    ahead_pages: int | None
    end_pages: int | None


def _read_ahead(pool: Pool, slots: np.ndarray) -> object | None:
    """The transport's read-ahead of the leading ``slots`` (at most the first batch's), or
    None. It only hastens the copies, so a failure is logged and the batches move the pages
    as ever."""
    geometry = pool.geometry
    try:
        return pool.transport.read_ahead(
            pool.tier_side.endpoint,
            pool.pool_side.endpoint,
            slots[: pool.ahead_pages] * geometry.page_bytes,
            geometry.page_bytes,
            geometry.fragments_per_page,
        )
    except Exception as err:
        message = "pool %r: reading ahead failed (%s); the batches move every page"
        log.warning(message, pool.name, err)
        return None


@dataclass(frozen=True, slots=True, eq=False)
class EarlyRead:
    """A read's first copies, started from the slots its keys had before the call was
    validated and claimed (:func:`read_early`); :meth:`read` takes the place of the pool's."""

    pool: Pool
    ticket: object
    slots: np.ndarray
    generations: np.ndarray

    def holds(self, claim: Claim) -> bool:
        """Whether ``claim`` begins with exactly these slots, none written since (a slot is
        written only after a reservation, which moves its generation on)."""
        n = len(self.slots)
        return (
            len(claim.slots) >= n
            and np.array_equal(claim.slots[:n], self.slots)
            and np.array_equal(claim.generations[:n], self.generations)
        )

    def read(self, keys: list[str], pages: np.ndarray) -> DramRead:
        return DramRead(self.pool, keys, pages, self)

    def cancel(self) -> None:
        """Nothing read early is used after (idempotent; a no-op once its read finished)."""
        self.pool.transport.forget(self.ticket)


def read_early(pool: Pool, keys: list[str]) -> EarlyRead | None:
    """Start a read of ``keys`` on ``pool`` before the call is validated and claimed: the
    transport reads ahead from the slots of the leading published keys (at most the first
    batch's), looked up without claiming or counting them. None when nothing was started; a
    key that cannot be looked up raises TypeError (the keys are checked after this: the
    pipeline then starts nothing and refuses the key)."""
    if not pool.transport.whole_slots:
        return None
    slots, generations = pool.store.peek(keys[: pool.ahead_pages])
    if not len(slots):
        return None
    ticket = _read_ahead(pool, slots)
    return None if ticket is None else EarlyRead(pool, ticket, slots, generations)


class _Copies:
    """The batches of one call: copy batches between the pool's pages and the call's slots,
    on the transport's threads."""

    #: Which way the bytes go: tier -> pool (a read) or pool -> tier.
    to_pool: ClassVar[bool]
    slots: np.ndarray
    ticket: object = None

    def __init__(self, pool: Pool, keys: list[str], pages: np.ndarray) -> None:
        self.pool, self.keys, self.pages = pool, keys, pages

    def _batch(self, positions: np.ndarray, shape: Shape) -> CopyBatch:
        pool, tier = self.pool.pool_side, self.pool.tier_side
        slots, pages = self.slots[positions], self.pages[positions]
        if self.to_pool:
            src, dst, src_idx, dst_idx = tier, pool, slots, pages
        else:
            src, dst, src_idx, dst_idx = pool, tier, pages, slots
        if self.pool.transport.whole_slots:  # the tier side slot by slot
            read = self.to_pool
            plain = slot_descriptors(pool.geometry, pages, tier.geometry, slots, read=read)
        else:
            plain = build_descriptors(src.geometry, src_idx, dst.geometry, dst_idx)
        return CopyBatch(src.endpoint, dst.endpoint, shape(plain), self.ticket)

    def submit(self, positions: np.ndarray, shape: Shape) -> Future[np.ndarray]:
        moved = self.pool.transport.submit(self._batch(positions, shape))
        done: Future[np.ndarray] = Future()
        count = len(positions)

        def settle(future: Future[None]) -> None:
            error = future.exception()
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(np.ones(count, dtype=bool))

        moved.add_done_callback(settle)
        return done


class DramRead(_Copies):
    """One get on one DRAM pool: the claim of its leading present run, held for the call."""

    to_pool = True

    def __init__(
        self, pool: Pool, keys: list[str], pages: np.ndarray, early: EarlyRead | None = None
    ) -> None:
        super().__init__(pool, keys, pages)
        self.claim: Claim = pool.store.claim(keys, distinct=True)  # distinct (backends.base)
        self.slots = self.claim.slots
        self.limit = len(self.slots)
        self.miss = "evicted" if self.claim.evicted else "absent"
        if early is not None and not early.holds(self.claim):
            early.cancel()  # read from slots that changed since: never used
            early = None
        if early is not None:
            self.ticket = early.ticket  # read from these very bytes: adopted
        elif pool.transport.whole_slots and self.limit:
            self._read_ahead()

    def _read_ahead(self) -> None:
        """Let the transport start on the claimed slots before the first batch is planned
        (:meth:`.Transport.read_ahead`): the claim keeps them unchanged until finish. The
        claim never outlives an interrupted start."""
        try:
            self.ticket = _read_ahead(self.pool, self.slots)
        except BaseException:
            self.abort()
            raise

    def _forget(self) -> None:
        """Before the claim ends: nothing read ahead of it may be used after."""
        if self.ticket is not None:
            self.pool.transport.forget(self.ticket)
            self.ticket = None

    def finish(self, moved: np.ndarray) -> list[bool]:
        self._forget()
        self.pool.store.release(self.claim)
        result = [False] * len(self.keys)
        result[: self.limit] = moved.tolist()
        return result

    def abort(self) -> None:
        self._forget()
        self.pool.store.release(self.claim)


class DramWrite(_Copies):
    """One set on one DRAM pool: its reservation, published for the pages that arrived."""

    to_pool = False
    #: Keys past ``limit``: every slot is held by transfers in flight.
    miss = "claimed"

    def __init__(self, pool: Pool, keys: list[str], pages: np.ndarray) -> None:
        super().__init__(pool, keys, pages)
        self.reservation: Reservation = pool.store.reserve(keys, distinct=True)
        self.slots = self.reservation.slots
        self.limit = len(self.reservation.keys)
        self.needs: np.ndarray | None = self.slots >= 0
        #: Pages of the call's first and last batches, each cut off as a batch of its own by
        #: the mover (:attr:`.Pool.end_pages`; None: batches as the strategy cuts them).
        self.ends = pool.end_pages

    def publish(self, positions: np.ndarray) -> None:
        """Publish the keys at ``positions`` now, their pages arrived (:class:`.PublishesEarly`);
        :meth:`finish` commits the rest."""
        self.pool.store.publish(self.reservation, positions)

    def finish(self, moved: np.ndarray) -> list[bool]:
        reservation = self.reservation
        ok = moved & (self.slots >= 0)
        self.pool.store.commit(reservation, ok)
        result = [False] * len(self.keys)
        if self.limit and True in reservation.present:  # the keys are distinct (backends.base)
            present = np.fromiter(reservation.present, dtype=bool, count=self.limit)
            result[: self.limit] = (ok | present).tolist()
        elif self.limit:
            result[: self.limit] = ok.tolist()
        return result

    def abort(self) -> None:
        self.pool.store.abort(self.reservation)
