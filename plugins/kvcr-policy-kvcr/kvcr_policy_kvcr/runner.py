"""Runner: one KVCR instance, every call into it, its completions and its lifetime.

KVCR's northbound API is not made for several caller threads at once (its operation handles
are counted outside its lock, ``query`` reads its tables unlocked, and ``poll_completed``
drains one shared queue), while SGLang calls from its prefetch and backup threads together. So
every call into KVCR takes this runner's lock, and one polling thread collects completions
(``poll_completed``) while operations are in flight and hands each to the future its caller
waits on: every ``poll_interval_s`` at first, less often (down to every 2 ms) while nothing
completes. The thread sleeps on a condition when nothing is in flight.

Operations are bounded twice: KVCR fails what its operation timeout expires; a completion that
never comes (KVCR's abandon timeout) fails the caller's future and is still waited for at
close. A completion that arrives after its caller gave up is consumed here, and the claims it
carries are released.

Lifetime: open -> closing -> closed. :meth:`Runner.close` waits for every operation in flight,
releases every claim still held, closes KVCR, and reports whether KVCR reached quiescence: only
then may the caller free the memory KVCR registered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kvcr.types import BlockKey, OpEntryResult, ReleaseHandle

from kvcr_policy.plugin_api import ClosedError, TransportError

from .telemetry import Totals

__all__ = ["Entries", "Runner"]

log = logging.getLogger("kvcr_policy_kvcr.runner")

Entries = Mapping[BlockKey, OpEntryResult]

#: Longest pause between polls while operations are in flight (a finished operation waits at
#: most this long for its caller to hear of it).
MAX_POLL_S = 0.002


@dataclass
class _Pending:
    kind: str
    future: Future[Entries]
    deadline: float
    abandoned: bool = False


@dataclass
class _Counters:
    started: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    peak_in_flight: int = 0
    abandoned: int = 0
    late_claims_released: int = 0


class Runner:
    """Serialises calls into ``kvcr`` (a ``kvcr.api.KVCR``) and collects its completions."""

    def __init__(
        self, kvcr: Any, name: str, poll_interval: float, abandon_s: float, totals: Totals
    ) -> None:
        self.kvcr = kvcr
        self.name = name
        self.state = "open"
        self.quiescent: bool | None = None  # known once closed
        self._interval = poll_interval
        self.abandon_s = abandon_s
        self._totals = totals
        self._lock = threading.Lock()  # every call into KVCR
        self._cond = threading.Condition()  # the pending table and the polling thread
        self._pending: dict[int, _Pending] = {}
        self._claims: set[ReleaseHandle] = set()
        self._failure: BaseException | None = None
        self._counters = _Counters()
        self._thread = threading.Thread(
            target=self._poll, name=f"kvcr-policy-poll-{name}", daemon=True
        )
        self._thread.start()

    # ---- calls ----------------------------------------------------------------------------

    def _check(self, call: str) -> None:
        if self.state != "open":
            raise ClosedError(f"KVCR runner {self.name!r} is {self.state}: {call}() refused")
        if self._failure is not None:
            failure = self._failure
            message = f"KVCR runner {self.name!r} failed earlier ({failure}); {call}() refused"
            raise TransportError(message)

    def start(self, kind: str, call: Callable[..., int], *args: Any) -> Future[Entries]:
        """Start ``call(*args)`` (``deposit``, ``deliver`` or ``fetch``); its entries arrive
        on the future (a TransportError when KVCR fails or never completes it)."""
        future: Future[Entries] = Future()
        with self._lock:
            self._check(kind)
            try:
                handle = call(*args)
            except Exception as err:
                if self._kvcr_failed():  # its progress thread died while nothing was pending
                    self._fail(err)
                    message = f"KVCR runner {self.name!r} failed: {err}; {kind}() refused"
                    raise TransportError(message) from err
                message = f"KVCR runner {self.name!r} refused a {kind}: {err}"
                raise TransportError(message) from err
            with self._cond:
                deadline = time.monotonic() + self.abandon_s
                self._pending[handle] = _Pending(kind, future, deadline)
                counters = self._counters
                counters.started[kind] = counters.started.get(kind, 0) + 1
                counters.in_flight = sum(not p.abandoned for p in self._pending.values())
                counters.peak_in_flight = max(counters.peak_in_flight, counters.in_flight)
                self._cond.notify_all()
        return future

    def _kvcr_failed(self) -> bool:
        """Whether KVCR itself has failed (its progress thread died). The polling thread finds
        that out only while something is pending; a call KVCR refuses asks here. Called with
        ``_lock`` held."""
        try:
            self.kvcr.get_stats()  # KVCR's one call that reports its failure and changes nothing
        except Exception:
            return True
        return False

    def query(self, keys: list[BlockKey]) -> list[Any]:
        with self._lock:
            self._check("query")
            return list(self.kvcr.query(keys))

    def hold(self, handles: Collection[ReleaseHandle]) -> None:
        """Record claims a fetch returned (released by :meth:`release` or at close)."""
        with self._lock:
            self._claims.update(handles)

    def release(self, handles: Collection[ReleaseHandle]) -> None:
        """Give claims back to KVCR (a claimed block can be evicted again)."""
        if not handles:
            return
        with self._lock:
            held = [h for h in handles if h in self._claims]
            self._claims.difference_update(held)
            if held and self._failure is None:
                self.kvcr.release(held)

    @property
    def claims(self) -> int:
        """Claims held now."""
        return len(self._claims)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            if self.state == "open" and self._failure is None:
                try:
                    self._totals.fold(self.kvcr.get_stats())
                except Exception as err:  # stats must never break the caller
                    log.debug("KVCR get_stats failed: %s", err)
            counters = self._counters
            return {
                "state": self.state,
                "failed": None if self._failure is None else str(self._failure),
                "operations": dict(counters.started),
                "in_flight": counters.in_flight,
                "peak_in_flight": counters.peak_in_flight,
                "abandoned": counters.abandoned,
                "claims_held": len(self._claims),
                "late_claims_released": counters.late_claims_released,
                "kvcr": self._totals.to_dict(),
            }

    # ---- completions ----------------------------------------------------------------------

    def _poll(self) -> None:
        idle = 0  # polls in a row that found nothing
        while True:
            with self._cond:
                while not self._pending and self.state != "closed":
                    self._cond.wait()
                if self.state == "closed":  # close() waited for what could complete
                    return
            try:
                with self._lock:
                    completed = list(self.kvcr.poll_completed())
            except BaseException as err:  # KVCR's progress thread died: every op fails
                self._fail(err)
                return
            for handle, entries in completed:
                self._settle(int(handle), entries)
            self._expire(time.monotonic())
            if completed:
                idle = 0
                continue
            # Back off while a long transfer runs: each poll takes the GIL from KVCR's own
            # progress thread, which looks at its transfers about once a millisecond anyway.
            time.sleep(min(self._interval * (1 << min(idle, 4)), MAX_POLL_S))
            idle += 1

    def _settle(self, handle: int, entries: Entries) -> None:
        with self._cond:
            pending = self._pending.pop(handle, None)
            self._recount()
            self._cond.notify_all()
        if pending is None:
            return
        if pending.abandoned:
            if pending.kind == "fetch":  # claims of a caller that gave up: give them back
                late = [e.release_handle for e in entries.values() if e.release_handle]
                with self._lock:
                    if late and self._failure is None:
                        self.kvcr.release(late)
                self._counters.late_claims_released += len(late)
            return
        pending.future.set_result(entries)

    def _recount(self) -> None:
        self._counters.in_flight = sum(not p.abandoned for p in self._pending.values())

    def _expire(self, now: float) -> None:
        expired: list[_Pending] = []
        with self._cond:
            for pending in self._pending.values():
                if not pending.abandoned and now >= pending.deadline:
                    pending.abandoned = True
                    expired.append(pending)
            self._counters.abandoned += len(expired)
            self._recount()
        for pending in expired:
            message = (
                f"KVCR runner {self.name!r}: a {pending.kind} did not complete within "
                f"{self.abandon_s:.1f} s (KVCR's abandon timeout, twice "
                "transport.op_timeout_s); its pages count as failed"
            )
            pending.future.set_exception(TransportError(message))

    def _fail(self, err: BaseException) -> None:
        log.error("KVCR runner %r failed: %s; its pages miss from now on", self.name, err)
        with self._cond:
            self._failure = err
            failed = [p for p in self._pending.values() if not p.abandoned]
            self._pending.clear()
            self._recount()
            self._cond.notify_all()
        for pending in failed:
            message = f"KVCR runner {self.name!r} failed: {err}"
            pending.future.set_exception(TransportError(message))

    # ---- lifetime -------------------------------------------------------------------------

    def close(self) -> bool:
        """Wait for every operation, release every claim, close KVCR; return whether KVCR is
        quiescent (nothing native can still touch its registered memory). Idempotent."""
        with self._cond:
            if self.state != "open":
                self._cond.wait_for(lambda: self.quiescent is not None)
                return bool(self.quiescent)
            self.state = "closing"
            # A completion is due within the abandon timeout of its start; past that, KVCR's
            # own close cancels what is left.
            deadline = max((p.deadline for p in self._pending.values()), default=0.0)
            self._cond.wait_for(lambda: not self._pending, max(0.0, deadline - time.monotonic()))
            left = len(self._pending)
            self.state = "closed"
            self._cond.notify_all()
        if left:
            log.warning("KVCR runner %r: closing with %d operations in flight", self.name, left)
        self._thread.join()
        quiescent = self._close_kvcr()
        with self._cond:
            self.quiescent = quiescent
            self._cond.notify_all()
        return quiescent

    def _close_kvcr(self) -> bool:
        with self._lock:
            if self._claims and self._failure is None:
                held = len(self._claims)
                log.warning("KVCR runner %r: releasing %d claims at close", self.name, held)
                try:
                    self.kvcr.release(list(self._claims))
                except Exception as err:
                    log.warning("KVCR runner %r: release at close failed: %s", self.name, err)
            self._claims.clear()
            try:
                self.kvcr.close()
            except BaseException as err:
                # KVCR keeps what native work may still touch when close fails; whether that
                # happened is its own (private) check. Unknown counts as not quiescent: leak.
                core = getattr(self.kvcr, "_core", None)
                quiescent = bool(core is not None and core.is_quiescent())
                log.error(
                    "KVCR runner %r: close failed (%s); quiescent: %s", self.name, err, quiescent
                )
                return quiescent
            return True
