"""Mover: one side-to-side transfer in batches, within the delivery window, with fallback.

The pipeline owns pools, claims and reservations; the mover owns the loop that turns a run of
pages into descriptor batches, keeps at most the window in flight, delivers results in order
and hands failed batches to the fallback strategy.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from .backends.dram.transports.base import CopyBatch, Endpoint, Transport
from .descriptors import build_descriptors
from .errors import ClosedError
from .geometry import PoolGeometry
from .stats import StatsRecorder
from .strategies import BatchingStrategy, CoalescingStrategy, FallbackStrategy

__all__ = ["Mover"]

log = logging.getLogger("kvcr_policy.pipeline")


def _failed(err: BaseException) -> Future[None]:
    future: Future[None] = Future()
    future.set_exception(err)
    return future


class Mover:
    """Runs page transfers with the strategies one pipeline resolved at build time."""

    def __init__(
        self,
        batching: BatchingStrategy,
        coalescing: CoalescingStrategy,
        allowed: frozenset[str],
        fallback: FallbackStrategy,
        transport: Transport,
        stats: StatsRecorder,
    ) -> None:
        self.batching = batching
        self.coalescing = coalescing
        self.allowed = allowed
        self.fallback = fallback
        self.transport = transport
        self._stats = stats

    def move(
        self,
        read: bool,
        src: tuple[Endpoint, PoolGeometry, np.ndarray],
        dst: tuple[Endpoint, PoolGeometry, np.ndarray],
        on_ready: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Copy page ``src[2][i]`` to page ``dst[2][i]`` for every i; per-page success, in order.

        ``src`` and ``dst`` are (endpoint, geometry, page indices). A read stops issuing
        batches after the first page that did not arrive: HiCache uses only the leading run,
        so later pages would be wasted bandwidth.
        """
        src_ep, src_geo, src_idx = src
        dst_ep, dst_geo, dst_idx = dst
        page_bytes = src_geo.page_bytes
        n = len(src_idx)
        ok = np.zeros(n, dtype=bool)
        window = self.batching.window
        inflight: deque[tuple[Future[None], int, int, int]] = deque()
        state = {"pages": 0, "bytes": 0, "stop": False}

        def move_page(i: int) -> bool:
            one = build_descriptors(src_geo, src_idx[i : i + 1], dst_geo, dst_idx[i : i + 1])
            self.transport.copy(CopyBatch(src_ep, dst_ep, one))
            return True

        def finish() -> None:
            future, start, stop, nbytes = inflight.popleft()
            state["pages"] -= stop - start
            state["bytes"] -= nbytes
            try:
                future.result()
                ok[start:stop] = True
            except Exception as err:
                reason = type(err).__name__
                log.warning("batch of %d pages failed (%s); falling back", stop - start, err)
                self._stats.fallback(reason, stop - start)
                ok[start:stop] = self.fallback.recover(stop - start, lambda i: move_page(start + i))
                if read and not ok[start:stop].all():
                    state["stop"] = True
            moved = int(ok[start:stop].sum())
            if read:
                self._stats.add(pages_read=moved, bytes_read=moved * page_bytes)
            else:
                self._stats.add(pages_written=moved, bytes_written=moved * page_bytes)
            if on_ready is not None and not state["stop"] and ok[:stop].all():
                on_ready(stop)

        try:
            for start, stop in self.batching.read_batches(n):
                if state["stop"]:
                    break
                plain = build_descriptors(
                    src_geo, src_idx[start:stop], dst_geo, dst_idx[start:stop]
                )
                prepared = self.coalescing.prepare(plain, self.allowed)
                nbytes = plain.nbytes
                while inflight and not window.admits(
                    len(inflight), state["pages"], state["bytes"], stop - start, nbytes
                ):
                    finish()
                if state["stop"]:  # a batch that just finished missed a page
                    break
                try:
                    future = self.transport.submit(CopyBatch(src_ep, dst_ep, prepared))
                except ClosedError:
                    raise
                except Exception as err:  # a transport that refuses at submit fails the batch
                    future = _failed(err)
                inflight.append((future, start, stop, nbytes))
                state["pages"] += stop - start
                state["bytes"] += nbytes
                self._stats.add(
                    batches=1, descriptors_before=len(plain), descriptors_after=len(prepared)
                )
                self._stats.peak("inflight_batches", len(inflight))
                self._stats.peak("inflight_bytes", state["bytes"])
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
        return ok
