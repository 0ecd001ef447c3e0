"""Faults the suite injects at the seam: a pool tier whose every second batch of several pages
fails, before it moved (``early``) or after (``late``: the bytes moved, the batch reports a
failure, as after a connection lost while the answer was on its way). The pipeline hands a
failed batch to its fallback page by page; a backend must serve those pages again, exactly."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Literal

import numpy as np

from ..errors import TransportError

__all__ = ["Fault", "FaultyTier"]

Fault = Literal["early", "late"]


class _Counter:
    def __init__(self) -> None:
        self.batches = 0
        self.failed = 0


class _FaultyTransfer:
    def __init__(self, transfer: Any, fault: Fault, counter: _Counter) -> None:
        self._transfer = transfer
        self._fault = fault
        self._counter = counter

    def __getattr__(self, name: str) -> Any:  # limit, needs, miss and what else it declares
        return getattr(self._transfer, name)

    def submit(self, positions: np.ndarray, shape: Any) -> Future[np.ndarray]:
        counter = self._counter
        if len(positions) < 2:
            return self._transfer.submit(positions, shape)  # the fallback's single pages pass
        counter.batches += 1
        if counter.batches % 2:
            return self._transfer.submit(positions, shape)
        counter.failed += 1
        failed: Future[np.ndarray] = Future()
        error = TransportError(f"injected {self._fault} fault of a batch of {len(positions)} pages")
        if self._fault == "early":
            failed.set_exception(error)
            return failed
        moved = self._transfer.submit(positions, shape)

        def report(done: Future[np.ndarray]) -> None:
            failed.set_exception(error if done.exception() is None else done.exception())

        moved.add_done_callback(report)
        return failed

    def finish(self, moved: np.ndarray) -> list[bool]:
        return self._transfer.finish(moved)

    def abort(self) -> None:
        self._transfer.abort()


class _FaultyEarly:
    def __init__(self, early: Any, fault: Fault, counter: _Counter) -> None:
        self._early, self._fault, self._counter = early, fault, counter

    def read(self, keys: list[str], pages: np.ndarray) -> _FaultyTransfer:
        return _FaultyTransfer(self._early.read(keys, pages), self._fault, self._counter)

    def cancel(self) -> None:
        self._early.cancel()


class FaultyTier:
    """``tier`` (a :class:`~kvcr_policy.backends.base.PoolTier`) whose transfers fail every
    second batch of several pages with a :class:`TransportError`; ``failed`` counts them."""

    def __init__(self, tier: Any, fault: Fault) -> None:
        self._tier = tier
        self._fault = fault
        self._counter = _Counter()

    @property
    def failed(self) -> int:
        return self._counter.failed

    def __getattr__(self, name: str) -> Any:  # contains, delete, clear, close, probe, stats...
        return getattr(self._tier, name)

    def read(self, keys: list[str], pages: np.ndarray) -> _FaultyTransfer:
        return _FaultyTransfer(self._tier.read(keys, pages), self._fault, self._counter)

    def write(self, keys: list[str], pages: np.ndarray) -> _FaultyTransfer:
        return _FaultyTransfer(self._tier.write(keys, pages), self._fault, self._counter)

    def read_early(self, keys: list[str]) -> _FaultyEarly | None:
        early = self._tier.read_early(keys)
        return None if early is None else _FaultyEarly(early, self._fault, self._counter)
