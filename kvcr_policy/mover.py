"""Mover: the one loop that drives every tier backend.

It cuts a call into batches (the batching strategy), keeps at most the delivery window in
flight, shapes each batch's descriptors through the coalescing strategy object (within what
the backend accepts), delivers results in order, and hands a failed batch to the fallback
strategy, page by page. Backends only move the batches they are given
(:class:`~kvcr_policy.backends.base.Transfer`), so a third-party strategy takes effect on every
backend alike.

Metrics: a call that passes a :class:`~kvcr_policy.observability.meter.DirectionMeter` gets
its totals (pages, batches, descriptors before and after coalescing and after the split, pages
handed to the fallback and why) summed into a :class:`CallCounts` and one observation of the
window per batch; nothing is recorded per page.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np

from .backends.base import EarlyRead, PoolTier, Shape, Transfer
from .descriptors import Descriptors, split_pieces
from .errors import CapacityError, ClosedError
from .observability.meter import CallCounts, DirectionMeter, PoolMeter, miss_reason
from .observability.stats import StatsRecorder
from .strategies import BatchingStrategy, CoalescingStrategy, FallbackStrategy

__all__ = ["Mover"]

log = logging.getLogger("kvcr_policy.pipeline")


def _failed(err: BaseException) -> Future[np.ndarray]:
    future: Future[np.ndarray] = Future()
    future.set_exception(err)
    return future


class Mover:
    """Runs transfers with the strategies one pipeline resolved at build time."""

    def __init__(
        self,
        batching: BatchingStrategy,
        coalescing: CoalescingStrategy,
        allowed: frozenset[str],
        fallback: FallbackStrategy,
        stats: StatsRecorder,
    ) -> None:
        self.batching = batching
        self.coalescing = coalescing
        self.allowed = allowed
        self.fallback = fallback
        self._stats = stats

    def shape(self, plain: Descriptors, within: frozenset[str] | None = None) -> Descriptors:
        """One batch's descriptors as the coalescing strategy shapes them (counted), using
        what the backend accepts (narrowed by ``within``, see :class:`~.backends.base.Shape`)."""
        allowed = self.allowed if within is None else self.allowed & within
        prepared = self.coalescing.prepare(plain, allowed)
        self._stats.add(descriptors_before=len(plain), descriptors_after=len(prepared))
        return prepared

    def _shaper(self, counts: CallCounts | None) -> Shape:
        """:meth:`shape`, also summing descriptor counts into ``counts`` when given."""
        if counts is None:
            return self.shape

        def shape(plain: Descriptors, within: frozenset[str] | None = None) -> Descriptors:
            prepared = self.shape(plain, within)
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

    def run(
        self,
        tier: PoolTier,
        read: bool,
        keys: list[str],
        pages: np.ndarray,
        page_bytes: int,
        on_ready: Callable[[int], None] | None = None,
        meter: PoolMeter | None = None,
        early: EarlyRead | None = None,
    ) -> list[bool]:
        """One get (``read``) or set call on ``tier``: begin, :meth:`move`, finish (abort on
        an exception); True per key that arrived (read) or is now present (write). ``early``
        (a read the tier started for these keys, :class:`~.backends.base.PoolReadsEarly`)
        begins the call in place of ``tier``.

        With ``meter``, the call's totals, latency and misses by reason are recorded once,
        and a read's claimed pages count as outstanding claims while it runs.
        """
        begin = tier.begin if early is None else early.begin
        if meter is None:
            transfer = begin(read, keys, pages)
            try:
                moved = self.move(transfer, read, page_bytes, on_ready)
            except BaseException:
                transfer.abort()
                raise
            return transfer.finish(moved)
        counts = CallCounts()
        start = time.perf_counter()
        claimed = 0
        try:
            transfer = begin(read, keys, pages)
            if read:
                claimed = transfer.limit
                meter.claims.inc(claimed)
            try:
                side = meter.direction(read)
                moved = self.move(transfer, read, page_bytes, on_ready, side, counts)
            except BaseException:
                transfer.abort()
                raise
            finally:
                if claimed:
                    meter.claims.dec(claimed)
            result = transfer.finish(moved)
        except Exception as err:
            meter.failed(read, len(keys), counts, err, page_bytes, time.perf_counter() - start)
            raise
        stored = len(result) if read else result.count(True)
        seconds = time.perf_counter() - start
        meter.done(read, len(keys), transfer, moved, stored, counts, page_bytes, seconds)
        if not read:
            meter.usage(tier)  # a write may have evicted and filled slots
        return result

    def move(
        self,
        transfer: Transfer,
        read: bool,
        page_bytes: int,
        on_ready: Callable[[int], None] | None = None,
        meter: DirectionMeter | None = None,
        counts: CallCounts | None = None,
    ) -> np.ndarray:
        """Move the pages ``transfer`` covers; per position of ``transfer.limit``, whether it
        moved (False where nothing needed moving).

        A read stops issuing batches after the first page that did not arrive: HiCache uses
        only the leading run, so later pages would be wasted bandwidth. ``on_ready(n)`` is told,
        in order, how many leading pages of a read are complete. ``counts`` (given with
        ``meter``) receives the call's totals; ``meter`` one window observation per batch.
        """
        limit = transfer.limit
        ok = np.zeros(limit, dtype=bool)
        needs = transfer.needs
        order = np.arange(limit) if needs is None else np.flatnonzero(needs[:limit])
        window = self.batching.window
        inflight: deque[tuple[Future[np.ndarray], int, int]] = deque()
        state = {"pages": 0, "stop": False}
        error: list[BaseException] = []
        absent: list[int] = []
        shape = self._shaper(counts)

        def finish() -> None:
            future, start, stop = inflight.popleft()
            positions = order[start:stop]
            count = stop - start
            state["pages"] -= count
            try:
                got = future.result()[:count]
                ok[positions] = got
                if read and not got.all():  # a key absent at the source: the run ends there
                    absent.append(int(positions[int(np.argmin(got))]))
            except CapacityError as err:
                # The tier is full: nothing more fits. With nothing stored at all, say so.
                if start == 0:
                    error.append(err)
                state["stop"] = True
            except Exception as err:
                log.warning("batch of %d pages failed (%s); falling back", count, err)
                self._stats.fallback(type(err).__name__, count)
                if counts is not None:
                    counts.failure = reason = miss_reason(err)
                    counts.fallback[reason] = counts.fallback.get(reason, 0) + count
                ok[positions] = self.fallback.recover(
                    count, lambda i: transfer.retry(int(positions[i]))
                )
            if read and not ok[positions].all():
                state["stop"] = True
            if on_ready is not None and not state["stop"]:
                on_ready(stop)

        try:
            for start, stop in self.batching.read_batches(len(order)):
                if state["stop"]:
                    break
                count = stop - start
                while inflight and not window.admits(
                    len(inflight),
                    state["pages"],
                    state["pages"] * page_bytes,
                    count,
                    count * page_bytes,
                ):
                    finish()
                if state["stop"]:  # a batch that just finished missed a page
                    break
                try:
                    future = transfer.submit(order[start:stop], shape)
                except ClosedError:
                    raise
                except Exception as err:  # a backend that refuses at submit fails the batch
                    future = _failed(err)
                inflight.append((future, start, stop))
                state["pages"] += count
                self._stats.add(batches=1)
                self._stats.peak("inflight_batches", len(inflight))
                self._stats.peak("inflight_bytes", state["pages"] * page_bytes)
                if meter is not None and counts is not None:
                    counts.batches += 1
                    meter.window(len(inflight), state["pages"] * page_bytes)
            while inflight:
                finish()
        except BaseException:
            # Never let the caller release claims or abort reservations while copies from or
            # into those slots are still running: wait for every batch already issued.
            for future, *_ in inflight:
                # Already failing: the first error is the one raised.
                with contextlib.suppress(BaseException):
                    future.result()
            raise
        if error:
            raise error[0]
        if absent:
            # Batches in flight together may complete past a key that was absent: only keys
            # before it were present as one run (a backend that claims per batch would otherwise
            # report keys after a gap, which one claimed run never does).
            ok[min(absent) :] = False
        moved = int(ok.sum())
        if counts is not None:
            counts.pages = moved
        if read:
            self._stats.add(pages_read=moved, bytes_read=moved * page_bytes)
        else:
            self._stats.add(pages_written=moved, bytes_written=moved * page_bytes)
        return ok
