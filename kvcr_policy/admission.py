"""Lookup-time admission of one pipeline: its live restore figures, the decision, the record.

The pipeline feeds :class:`AdmissionDesk` from every restore call (the bytes queued while it
runs, then the bytes it moved and its seconds: ``seconds = fixed + bytes / rate`` fitted over
the calls, :mod:`.observability.marginal`, since a call pays its round trips and wake-ups
whatever its size, and a rate of bytes over seconds would charge a long prefix for them once a
page), from every store call (its bytes queued while it runs: a tier that paces a tenant's
reads and writes together, as ``serve --tenant-rate`` does, delivers a restore behind them;
then its bytes and seconds, the marginal rate the gate starts from before restores) and from
the prefill an engine reports where it exposes one (tokens and seconds of its steps: a cost
a token and a cost a token pair, the step's fixed cost fitted apart,
:mod:`.observability.prefill_cost`). A lookup
(:meth:`~kvcr_policy.pipeline.Pipeline.admit`) asks the configured admission strategy how
many of its leading present pages to report, counts the decision in the pool's
``kvcr_policy_admission_pages`` and in :attr:`AdmissionDesk.counts`, and explains it at debug
level (logger ``kvcr_policy.admission``). Given the lookup's keys, it notes the declined ones
in :attr:`AdmissionDesk.declined` (:mod:`.declined`): the engine computes them, and its
integration leaves them out of its next write of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from .declined import DeclinedKeys
from .observability.marginal import MarginalRate
from .observability.meter import PoolMeter
from .observability.prefill_cost import PrefillCost
from .strategies import Admission, AdmissionStrategy, RestoreOutlook

__all__ = ["AdmissionDesk"]

log = logging.getLogger("kvcr_policy.admission")

#: Half-life of the restore and prefill rates: long enough to smooth one slow call, short
#: enough that a tier that slowed down (or a tenant that started sharing it) shows in seconds.
HALF_LIFE_S = 10.0


class AdmissionDesk:
    """One pipeline's admission strategy and what it decides on; thread-safe."""

    def __init__(
        self,
        strategy: AdmissionStrategy,
        clock: Callable[[], float] = time.monotonic,
        half_life_s: float = HALF_LIFE_S,
    ) -> None:
        self.strategy = strategy
        #: Restores and stores: seconds = fixed + bytes / rate, fitted over their calls.
        self.restores = MarginalRate(half_life_s, clock)
        self.stores = MarginalRate(half_life_s, clock)
        #: The engine's prefill: seconds = fixed + tokens / rate + quadratic * tokens**2,
        #: fitted over its steps; the gate compares a restore with what computing its pages
        #: adds (the fixed part is paid anyway).
        self.prefills = PrefillCost(half_life_s, clock)
        self._lock = threading.Lock()
        self._reading = 0
        self._writing = 0
        #: Pages by ``(decision, reason)`` since the pipeline opened.
        self.counts: Counter[tuple[str, str]] = Counter()
        #: Present keys a lookup declined, per pool, until an engine's write leaves them out.
        self.declined = DeclinedKeys()
        #: The engine times its restores itself, from the lookup that asked the tier to the
        #: restored pages in use (:meth:`~kvcr_policy.pipeline.Pipeline.restored`): the
        #: pipeline's own get calls then feed :attr:`restores` nothing, only the queue.
        self.engine_times_restores = False

    @contextmanager
    def restoring(self, nbytes: int) -> Iterator[None]:
        """A restore of ``nbytes`` is queued or moving while the block runs."""
        with self._lock:
            self._reading += nbytes
        try:
            yield
        finally:
            with self._lock:
                self._reading -= nbytes

    @contextmanager
    def storing(self, nbytes: int) -> Iterator[None]:
        """A store of ``nbytes`` is queued or moving while the block runs: a restore asked now
        shares the link (and a paced tenant's budget) with it."""
        with self._lock:
            self._writing += nbytes
        try:
            yield
        finally:
            with self._lock:
                self._writing -= nbytes

    @property
    def queued(self) -> tuple[int, int]:
        """Bytes of restores and of stores in flight now."""
        with self._lock:
            return self._reading, self._writing

    def outlook(self) -> RestoreOutlook:
        """What the tier delivers now: the figures a decision is made on."""
        restores = self.restores.figures()  # one reading: rate, fixed part, mean call
        prefill = self.prefills.figures()
        step = prefill.line if prefill is not None and self.engine_times_restores else None
        return RestoreOutlook(
            None if restores is None else restores.rate,
            sum(self.queued),
            self.restores.idle_s,
            None if prefill is None else prefill.line.rate,
            self.stores.per_second,
            restore_fixed_s=restores.fixed if restores is not None and restores.separated else None,
            restore_call=None if restores is None else restores.mean_call,
            restore_calls=0 if restores is None else restores.calls,
            step_fixed_s=step.fixed if step is not None and step.separated else None,
            prefill_s_per_token2=0.0 if prefill is None else prefill.quadratic,
        )

    def declines(
        self,
        pool: str,
        pages: int,
        page_tokens: int,
        page_bytes: int,
        meter: PoolMeter | None,
        pools: Sequence[str] = (),
    ) -> Admission | None:
        """The strategy's decision on a lookup of ``pages`` pages of ``pool`` were they all
        present, when it reports none of them, counted as :meth:`decide` counts a lookup that
        found them all and was declined (the lookup answers "no hit" on it, without asking the
        tier); None, uncounted, when it would report some (the lookup then asks the tier and
        :meth:`decide` counts what it found). A strategy that reports none of a run of pages
        reports none of any shorter run (the built-in gate's longest prefix that restores
        sooner), so no shorter present run would be a hit."""
        if pages <= 0:
            return None
        outlook = self.outlook()
        decision = self.strategy.admit(pages, page_tokens, page_bytes, outlook)
        if int(decision.pages) > 0:
            return None
        self._count(pool, pages, 0, decision, meter, (), pools, outlook, page_bytes)
        return decision

    def decide(
        self,
        pool: str,
        found: int,
        page_tokens: int,
        page_bytes: int,
        meter: PoolMeter | None,
        keys: Sequence[str] = (),
        pools: Sequence[str] = (),
    ) -> int:
        """How many of ``found`` leading present pages of ``pool`` to report; counted. Of
        ``keys`` (the lookup's, where given), the declined ones (``keys[pages:found]``) are
        noted in :attr:`declined` for each of ``pools`` (``pool`` alone when empty)."""
        if found <= 0:
            return 0
        outlook = self.outlook()
        decision = self.strategy.admit(found, page_tokens, page_bytes, outlook)
        pages = min(max(int(decision.pages), 0), found)  # a plugin cannot report more
        self._count(pool, found, pages, decision, meter, keys, pools, outlook, page_bytes)
        return pages

    def _count(
        self,
        pool: str,
        found: int,
        pages: int,
        decision: Admission,
        meter: PoolMeter | None,
        keys: Sequence[str],
        pools: Sequence[str],
        outlook: RestoreOutlook,
        page_bytes: int,
    ) -> None:
        """Count ``pages`` of ``found`` admitted by ``decision`` (the rest declined), note the
        declined ``keys``, explain it at debug level."""
        declined = found - pages
        with self._lock:
            if pages:
                self.counts["admitted", decision.reason] += pages
            if declined:
                self.counts["declined", decision.declined or decision.reason] += declined
        if declined and keys:
            self.declined.note(pools or [pool], keys[pages:found])
        if meter is not None:
            meter.admission(pages, decision.reason, declined, decision.declined or decision.reason)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s", _explain(pool, found, pages, decision, outlook, page_bytes))


def _explain(
    pool: str, found: int, pages: int, d: Admission, o: RestoreOutlook, page_bytes: int
) -> str:
    def seconds(value: float | None) -> str:
        return "unknown" if value is None else f"{value:.4f} s"

    rate = "unmeasured" if o.bytes_per_s is None else f"{o.bytes_per_s / 1e6:.1f} MB/s"
    if o.bytes_per_s is not None:
        fixed = "unseparated" if o.restore_fixed_s is None else f"{o.restore_fixed_s:.4f} s"
        rate += f" + {fixed} a call over {o.restore_calls} restores"
    prefill = (
        "engine unreported"
        if o.prefill_tokens_per_s is None
        else f"{o.prefill_tokens_per_s:.0f} tokens/s"
        + (f" + {o.prefill_s_per_token2:.3g} s/token^2" if o.prefill_s_per_token2 else "")
        + " reported"
    )
    declined = f", {found - pages} declined ({d.declined or d.reason})" if pages < found else ""
    return (
        f"pool {pool!r}: {pages} of {found} present pages admitted ({d.reason}){declined}; "
        f"restore of {found} pages ({found * page_bytes} bytes, {o.queued_bytes} queued) "
        f"{seconds(d.restore_s)} at {rate}, compute {seconds(d.compute_s)} ({prefill})"
    )
