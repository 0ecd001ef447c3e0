"""Mover: the one loop that drives every tier backend.

It cuts a call into batches (the batching strategy), keeps at most the delivery window in
flight, shapes each batch's descriptors through the coalescing strategy object (within what
the backend accepts), delivers results in order, and hands a failed batch to the fallback
strategy, which submits its pages again one at a time. Backends only move the batches they are
given (:class:`~kvcr_policy.backends.base.ReadTransfer`,
:class:`~kvcr_policy.backends.base.WriteTransfer`), so a third-party strategy takes effect on
every backend alike.

Each call's totals (pages, batches, descriptors before and after coalescing and after the
split, the window after each submit, pages handed to the fallback and why) are summed into
the :class:`~kvcr_policy.observability.ledger.CallCounts` the caller passes: the one record
``stats()`` and the metrics read. Nothing is recorded per page.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np

from .backends.base import (
    EarlyRead,
    PoolTier,
    PublishesEarly,
    ReadTransfer,
    Shape,
    Transfer,
    WriteTransfer,
)
from .builtin.batching import cut_ends, joined, least_pages
from .descriptors import Descriptors, split_pieces
from .errors import CapacityError, ClosedError
from .observability.ledger import CallCounts
from .observability.repeats import Repeats
from .strategies import BatchingStrategy, CoalescingStrategy, FallbackStrategy

__all__ = ["Mover"]

log = logging.getLogger("kvcr_policy.pipeline")


def _failed(err: BaseException) -> Future[np.ndarray]:
    future: Future[np.ndarray] = Future()
    future.set_exception(err)
    return future


def _plain(plain: Descriptors, within: frozenset[str] | None = None) -> Descriptors:
    """The shape of a page the fallback submits alone: its plain descriptors, uncounted."""
    return plain


class Mover:
    """Runs transfers with the strategies one pipeline resolved at build time."""

    def __init__(
        self,
        batching: BatchingStrategy,
        coalescing: CoalescingStrategy,
        allowed: frozenset[str],
        fallback: FallbackStrategy,
        least_bytes: int | None = None,
    ) -> None:
        self.batching = batching
        #: ``batching.read_batch_bytes``: batches are joined until they hold this many bytes.
        self.least_bytes = least_bytes
        self.coalescing = coalescing
        self.allowed = allowed
        self.fallback = fallback
        # A tier that is down fails every call: one line per interval, per pipeline (one
        # pipeline's failures never hide another's first one).
        self.repeats = Repeats(log)

    def shaper(self, counts: CallCounts) -> Shape:
        """One batch's descriptors as the coalescing strategy shapes them, using what the
        backend accepts (narrowed by ``within``, see :class:`~.backends.base.Shape`), each
        batch counted into ``counts``."""

        def shape(plain: Descriptors, within: frozenset[str] | None = None) -> Descriptors:
            allowed = self.allowed if within is None else self.allowed & within
            prepared = self.coalescing.prepare(plain, allowed)
            counts.plain += len(plain)
            counts.sent += len(prepared)
            pieces = 0 if prepared is plain else split_pieces(prepared)
            counts.coalesced += len(prepared) - pieces
            return prepared

        return shape

    def count(self, pool: PoolTier, keys: Sequence[str]) -> int:
        """How many keys from the start ``pool`` holds, asked in metadata-query batches."""
        for start, stop in self.batching.query_batches(len(keys)):
            found = pool.contains(keys[start:stop])
            if found < stop - start:
                return start + found
        return len(keys)

    def read(
        self,
        tier: PoolTier | EarlyRead,
        keys: list[str],
        pages: np.ndarray,
        page_bytes: int,
        counts: CallCounts,
        on_ready: Callable[[int], None] | None = None,
        on_claim: Callable[[int], None] | None = None,
    ) -> list[bool]:
        """One get call on ``tier`` (a pool tier, or the read it started early): read, move,
        finish (abort on an exception); True per key that arrived. ``on_claim(n)`` is told
        how many pages the call holds claimed while it runs (and ``-n`` when it ends)."""
        counts.keys = len(keys)
        try:
            transfer: ReadTransfer = tier.read(keys, pages)
            counts.limit, counts.past = transfer.limit, transfer.miss
            claimed = transfer.limit if on_claim is not None else 0
            if claimed and on_claim is not None:
                on_claim(claimed)
            try:
                moved = self._moved(transfer, True, page_bytes, counts, on_ready)
            finally:
                if claimed and on_claim is not None:
                    on_claim(-claimed)
            return transfer.finish(moved)
        except Exception as err:
            counts.error = err
            raise

    def write(
        self,
        tier: PoolTier,
        keys: list[str],
        pages: np.ndarray,
        page_bytes: int,
        counts: CallCounts,
    ) -> list[bool]:
        """One set call on ``tier``: write, move, finish (abort on an exception); True per key
        now present."""
        counts.keys = len(keys)
        try:
            transfer: WriteTransfer = tier.write(keys, pages)
            counts.limit, counts.past = transfer.limit, transfer.miss
            moved = self._moved(transfer, False, page_bytes, counts, None)
            result = transfer.finish(moved)
        except Exception as err:
            counts.error = err
            raise
        needs = transfer.needs
        if needs is None:
            counts.lost = transfer.limit - int(np.count_nonzero(moved))
        else:
            counts.lost = int(np.count_nonzero(needs[: transfer.limit] & ~moved))
        counts.stored = result.count(True)
        return result

    def _moved(
        self,
        transfer: Transfer,
        read: bool,
        page_bytes: int,
        counts: CallCounts,
        on_ready: Callable[[int], None] | None,
    ) -> np.ndarray:
        try:
            return self.move(transfer, read, page_bytes, counts, on_ready)
        except BaseException:
            transfer.abort()
            raise

    def move(
        self,
        transfer: Transfer,
        read: bool,
        page_bytes: int,
        counts: CallCounts,
        on_ready: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Move the pages ``transfer`` covers; per position of ``transfer.limit``, whether it
        moved (False where nothing needed moving).

        A read stops issuing batches after the first page that did not arrive: HiCache uses
        only the leading run, so later pages would be wasted bandwidth. ``on_ready(n)`` is told,
        in order, how many leading pages of a read are complete.
        """
        limit = transfer.limit
        needs = None if read else transfer.needs  # type: ignore[union-attr]
        order = np.arange(limit) if needs is None else np.flatnonzero(needs[:limit])
        flight = _Flight(self, transfer, read, order, limit, page_bytes, counts, on_ready)
        shape = self.shaper(counts)
        window = self.batching.window
        batches = self.batches(len(order), page_bytes)
        if flight.publish is not None:  # a write's first and last pages as batches of their own
            batches = cut_ends(batches, getattr(transfer, "ends", None))
        try:
            for start, stop in batches:
                if flight.stop:
                    break
                count = stop - start
                while flight.batches and not window.admits(
                    len(flight.batches), flight.pages, flight.pages * page_bytes,
                    count, count * page_bytes,
                ):  # fmt: skip
                    flight.settle()
                if flight.stop:  # a batch that just finished missed a page
                    break
                flight.submit(start, stop, shape)
            flight.issued = True
            while flight.batches:
                flight.settle()
        except BaseException:
            # Never let the caller release claims or abort reservations while copies from or
            # into those slots are still running: wait for every batch already issued.
            flight.drain()
            raise
        return flight.result()

    def batches(self, pages: int, page_bytes: int) -> list[tuple[int, int]]:
        """The strategy's batches of ``pages`` pages, joined to ``least_bytes``."""
        return joined(self.batching.read_batches(pages), least_pages(self.least_bytes, page_bytes))

    def retry(self, transfer: Transfer, position: int) -> bool:
        """The fallback's unit: page ``position`` submitted alone, plain, and waited for."""
        return bool(transfer.submit(np.array([position], dtype=np.int64), _plain).result()[0])


class _Flight:
    """The batches of one call in flight, in submission order, and what they delivered."""

    def __init__(
        self,
        mover: Mover,
        transfer: Transfer,
        read: bool,
        order: np.ndarray,
        limit: int,
        page_bytes: int,
        counts: CallCounts,
        on_ready: Callable[[int], None] | None,
    ) -> None:
        self.mover, self.transfer, self.read, self.order = mover, transfer, read, order
        self.page_bytes, self.counts, self.on_ready = page_bytes, counts, on_ready
        self.ok = np.zeros(limit, dtype=bool)
        self.batches: deque[tuple[Future[np.ndarray], int, int]] = deque()
        self.pages = 0  # pages in flight
        self.stop = False
        self.error: BaseException | None = None
        self.absent: int | None = None  # the first position a read found absent
        self.issued = False  # every batch of the call is submitted
        # A write that can publish each batch's keys as the batch settles, while later
        # batches copy; otherwise its finish publishes every key after the last copy, the copy
        # engines idle (5.8 ms for 8,192 keys on one H100).
        self.publish: Callable[[np.ndarray], None] | None = (
            transfer.publish if not read and isinstance(transfer, PublishesEarly) else None
        )

    def submit(self, start: int, stop: int, shape: Shape) -> None:
        try:
            future = self.transfer.submit(self.order[start:stop], shape)
        except ClosedError:
            raise
        except Exception as err:  # a backend that refuses at submit fails the batch
            future = _failed(err)
        self.batches.append((future, start, stop))
        self.pages += stop - start
        self.counts.window(len(self.batches), self.pages * self.page_bytes)

    def settle(self) -> None:
        """Wait for the oldest batch; a failed one goes to the fallback, page by page."""
        future, start, stop = self.batches.popleft()
        positions = self.order[start:stop]
        count = stop - start
        self.pages -= count
        landed = None
        try:
            got = future.result()[:count]
            self.ok[positions] = got
            if self.read and not got.all():  # a key absent at the source: the run ends there
                first = int(positions[int(np.argmin(got))])
                self.absent = first if self.absent is None else min(self.absent, first)
            if self.publish is not None and (self.batches or not self.issued):
                # Not the call's last batch to settle: the finish publishes that one with
                # whatever else is left, in one pass after the last copy instead of two.
                landed = positions[got]
        except CapacityError as err:
            # The tier is full: nothing more fits. With nothing stored at all, say so.
            if start == 0:
                self.error = err
            self.stop = True
        except Exception as err:
            kind = f"batch failed: {type(err).__name__}"  # the text varies (retry times)
            self.mover.repeats.warning(
                kind, "batch of %d pages failed (%s); falling back", count, err
            )
            self.counts.failed(err, count)
            retry, transfer = self.mover.retry, self.transfer
            self.ok[positions] = self.mover.fallback.recover(
                count, lambda i: retry(transfer, int(positions[i]))
            )
        if landed is not None and self.publish is not None:  # (the second for the checker)
            self.publish(landed)  # out of the try: a failure to publish is no failed copy
        if self.read and not self.ok[positions].all():
            self.stop = True
        if self.on_ready is not None and not self.stop:
            self.on_ready(stop)

    def drain(self) -> None:
        for future, *_ in self.batches:
            # Already failing: the first error is the one raised.
            with contextlib.suppress(BaseException):
                future.result()

    def result(self) -> np.ndarray:
        if self.error is not None:
            raise self.error
        if self.absent is not None:
            # Batches in flight together may complete past a key that was absent: only keys
            # before it were present as one run (a backend that claims per batch would otherwise
            # report keys after a gap, which one claimed run never does).
            self.ok[self.absent :] = False
        self.counts.pages = int(self.ok.sum())
        return self.ok
