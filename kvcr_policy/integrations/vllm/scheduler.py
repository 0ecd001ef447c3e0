"""The connector's scheduler half: lookups that never block, and the plan of each step.

- **Lookups.** ``get_num_new_matched_tokens`` hands the count of the request's present pages to
  a lookup thread and answers ``None`` ("ask again") until it is known, so the scheduler never
  waits on the tier while it has other requests to run (a peer or host tier answers over a
  socket). With none running (every other request it knows finished or not yet scheduled),
  it waits for the answer up to ``idle_wait_s`` (:data:`IDLE_WAIT_S`) a call, its lock
  released: an idle vLLM calls again at once, and each call costs its engine thread about
  0.1 ms of the lock the lookup thread needs, so on 2 cores a lookup asked 11 to 70 times
  took 2 to 8 ms to answer a request whose prefill takes 9. A hit is loaded asynchronously
  (``True``): vLLM parks the request until the workers report the load.
  At least the prompt's last token is always left to compute, as vLLM requires.
- **Lookups the gate declines.** Where the admission gate would report none of the asked
  pages even were they all present (``declines``: its decision on the figures of the moment),
  the answer is "no hit" at once: vLLM computes the request in this step instead of waiting
  for the tier's answer (one scheduler step or more on a busy engine, the lookup's round trip
  on an idle one). The tier is not asked at all: its answer could not change the decision,
  and a tier query beside the prefill it would run beside took the CPU from it (vLLM on 2
  cores: the gated TTFT 1.13 of the engine's without a tier, request by request, against
  1.05 without the query). ``declines`` counts the decision, every asked page declined, and
  those pages may be saved again (the tier skips the pages it holds: a round trip, no
  bytes). A request asked
  again (vLLM found no room for it) gets the same answer, without asking the gate or the
  tier again. Where the decision says so (``Admission.save`` False: the gate's
  ``save_when_declined`` unset), the request's pages are not saved either: no restore of
  them would pay, and vLLM would keep their blocks until written.
- **Partial hits.** The leading run of present pages beyond vLLM's own prefix hit is loaded;
  a page that fails to arrive is reported by the worker, and vLLM recomputes from there.
- **Saves.** Each step, every full prompt block computed by that step and not already in the
  tier (hit locally, loaded, or present but declined by the admission gate: the pipeline's
  admission noted it, :mod:`kvcr_policy.declined`, and ``declined`` drops it) is saved; vLLM
  keeps a finished request's blocks until the workers report its transfers ended
  (``request_finished`` returns True), so a block is never reused while a save still reads it.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from ...memory.cpus import spread_thread
from .jobs import BlockJob, StepPlan, count
from .keys import block_keys

__all__ = ["SchedulerHalf"]

log = logging.getLogger("kvcr_policy.integrations.vllm")

#: The longest a lookup call waits for the tier's answer while vLLM runs no other request
#: (then it answers "ask again", and vLLM, idle, calls again at once).
IDLE_WAIT_S = 0.002


@dataclass(slots=True)
class _Request:
    tokens: Sequence[int]  # the prompt's token ids (vLLM's own list: never changed)
    block: int
    prefix: str
    block_ids: list[int] = field(default_factory=list)
    saved: int = 0  # leading blocks already in the tier (or hit by vLLM)
    load_start: int = 0
    held: bool = False  # a load or save was planned: vLLM keeps its blocks
    declined_at: int | None = None  # the gate declined every page from this block on
    unsaved: bool = False  # ... and said not to save them (``Admission.save``)
    asked_at: float | None = None  # when its last lookup asked the tier
    loading: int = 0  # pages of its load in flight
    _keys: list[str] | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.tokens)

    @property
    def blocks(self) -> int:
        """Full blocks of the prompt: one key each."""
        return len(self.tokens) // self.block

    @property
    def keys(self) -> list[str]:
        """The full blocks' keys, hashed when first asked for: a lookup the gate declines
        whole, of a request whose pages are not saved, never needs them (computed twice, on
        two threads at once, they are equal)."""
        keys = self._keys
        if keys is None:
            keys = self._keys = block_keys(self.tokens, self.block, self.prefix, self.blocks)
        return keys


class SchedulerHalf:
    """See the module docstring. ``lookup(keys)`` counts present leading keys: an int, or
    ``(present, admitted)`` where an admission gate reports fewer than are present (the
    others are computed, and not saved again: ``declined(keys)`` says, per key of a planned
    save, whether the gate declined it, None when none, as
    :meth:`kvcr_policy.declined.DeclinedKeys.split` does). ``declines(pages)``, where given,
    is the gate's decision when it would report none of ``pages`` pages all present (else
    None), counted by it; the tier is then not asked."""

    def __init__(
        self,
        block_size: int,
        prefix: str,
        lookup: Any,
        declined: Callable[[Sequence[str]], list[bool] | None] | None = None,
        declines: Callable[[int], object | None] | None = None,
        restored: Callable[[int, float], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        idle_wait_s: float = IDLE_WAIT_S,
    ) -> None:
        self.block = block_size
        self._idle_wait_s = idle_wait_s
        self._restored = restored
        self._clock = clock
        self.prefix = prefix
        self._lookup = lookup
        self._declined = declined
        self._declines = declines
        self._threads = ThreadPoolExecutor(
            1, thread_name_prefix="kvcr-vllm-lookup", initializer=spread_thread
        )
        self._asked: dict[str, tuple[int, Future[tuple[int, int]]]] = {}
        self._requests: dict[str, _Request] = {}
        #: Requests vLLM scheduled and has not finished: while there are none but the asking
        #: one, a lookup waits for its answer (:data:`IDLE_WAIT_S`).
        self._running: set[str] = set()
        self._loads: list[BlockJob] = []
        self.stats: Counter[str] = Counter()  # since vLLM last asked (get_kv_connector_stats)

    def _state(self, request: Any) -> _Request:
        state = self._requests.get(request.request_id)
        if state is None:
            tokens = request.prompt_token_ids or ()
            state = self._requests[request.request_id] = _Request(tokens, self.block, self.prefix)
        return state

    def _count(self, keys: list[str]) -> tuple[int, int]:
        """``(present, admitted)`` leading keys."""
        try:
            found = self._lookup(keys)
        except Exception as err:  # a lookup that fails is a miss, never a dead scheduler
            log.warning("kvcr_policy: lookup of %d pages failed: %s", len(keys), err)
            return 0, 0
        present, admitted = found if isinstance(found, tuple) else (found, found)
        return int(present), min(int(admitted), int(present))

    def _count_of(self, state: _Request, start: int, limit: int) -> tuple[int, int]:
        """:meth:`_count` of the request's keys ``start:limit``, hashed on the lookup thread."""
        return self._count(state.keys[start:limit])

    def _decided(self, pages: int) -> object | None:
        """The gate's decision when it reports none of ``pages`` pages, present or not (then
        counted by ``declines``)."""
        if self._declines is None:
            return None
        try:
            return self._declines(pages)
        except Exception as err:  # the figures are unreadable: ask the tier as without a gate
            log.warning("kvcr_policy: admission of %d pages failed: %s", pages, err)
            return None

    def matched(self, request: Any, computed: int) -> tuple[int | None, bool]:
        state = self._state(request)
        start = computed // self.block
        limit = min(state.blocks, (state.prompt_tokens - 1) // self.block)
        if start >= limit:
            return 0, False
        if state.declined_at == start:  # asked again (vLLM had no room for it): same answer
            return 0, False
        asked = self._asked.get(request.request_id)
        if asked is None or asked[0] != start:
            decided = self._decided(limit - start)
            if decided is not None:  # no hit whatever the tier holds: vLLM computes now
                self._asked.pop(request.request_id, None)
                state.saved = max(state.saved, start)
                state.declined_at = start
                state.unsaved = not getattr(decided, "save", True)
                self._counted(limit - start, 0, declined_at_once=1)
                return 0, False
            state.asked_at = self._clock()
            future = self._threads.submit(self._count_of, state, start, limit)
            self._asked[request.request_id] = asked = (start, future)
        if not asked[1].done() and not self._answered_while_idle(request.request_id, asked[1]):
            return None, False
        del self._asked[request.request_id]
        _, hits = asked[1].result()  # present beyond hits: declined (see _save)
        state.saved = max(state.saved, start + hits)  # loaded; declined ones: ``declined``
        self._counted(limit - start, hits)
        if hits == 0:
            return 0, False
        state.load_start = start
        return hits * self.block, True

    def _answered_while_idle(self, request_id: str, future: Future[tuple[int, int]]) -> bool:
        """Whether ``future`` is done after waiting for it up to ``idle_wait_s``, where vLLM
        runs no request but ``request_id`` (else False at once: never a wait while there are
        others to run)."""
        running = self._running
        if running and (len(running) > 1 or request_id not in running):
            return False
        done, _ = wait((future,), timeout=self._idle_wait_s)
        return bool(done)

    def _counted(self, pages: int, hits: int, **more: int) -> None:
        figures = {"lookups": 1, "lookup_pages": pages, "hit_pages": hits, **more}
        count(**figures)
        self.stats.update(figures)

    def allocated(self, request: Any, block_ids: list[int], external: int) -> None:
        if external <= 0:
            return
        state = self._requests[request.request_id]
        first, pages = state.load_start, external // self.block
        job = BlockJob(
            request.request_id,
            tuple(state.keys[first : first + pages]),
            tuple(block_ids[first : first + pages]),
        )
        self._loads.append(job)
        state.held = True
        state.loading += pages
        count(hit_tokens=external)
        self.stats.update(hit_tokens=external)

    def plan(self, output: Any) -> StepPlan:
        """This step's loads and saves from vLLM's ``SchedulerOutput``."""
        saves: list[BlockJob] = []
        scheduled = output.num_scheduled_tokens
        prefill = squares = 0  # the new requests' tokens and their attention's spans
        for new in output.scheduled_new_reqs:
            self._running.add(new.req_id)
            done, more = int(new.num_computed_tokens), int(scheduled[new.req_id])
            prefill += more
            squares += (done + more) ** 2 - done**2
            state = self._requests.get(new.req_id)
            if state is None:
                tokens = new.prompt_token_ids or ()
                state = self._requests[new.req_id] = _Request(tokens, self.block, self.prefix)
            state.block_ids = list(new.block_ids[0])
            state.saved = max(state.saved, new.num_computed_tokens // self.block)
            self._save(new.req_id, state, done + more, saves)
        cached = output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None:
                continue
            blocks = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                state.block_ids = list(blocks[0]) if blocks else []
            elif blocks:
                state.block_ids.extend(blocks[0])
            self._save(req_id, state, cached.num_computed_tokens[i] + scheduled[req_id], saves)
        loads, self._loads = tuple(self._loads), []
        if len(output.scheduled_new_reqs) != len(scheduled):  # it decodes too: not timed
            return StepPlan(loads, tuple(saves))
        return StepPlan(loads, tuple(saves), prefill, squares)

    def _save(self, req_id: str, state: _Request, computed: int, saves: list[BlockJob]) -> None:
        full = min(computed, state.prompt_tokens, state.blocks * self.block) // self.block
        full = min(full, len(state.block_ids))
        if full <= state.saved:
            return
        if state.unsaved:  # the gate said no restore of them would pay: vLLM frees them now
            self.stats.update(unsaved_pages=full - state.saved)
            count(unsaved_pages=full - state.saved)
            state.saved = full
            return
        keys, blocks = state.keys[state.saved : full], state.block_ids[state.saved : full]
        state.saved = full
        skip = self._declined(keys) if self._declined is not None else None
        if skip is not None:  # in the tier, declined at lookup: computed, not saved again
            keys = [key for key, out in zip(keys, skip, strict=True) if not out]
            blocks = [block for block, out in zip(blocks, skip, strict=True) if not out]
        if keys:
            saves.append(BlockJob(req_id, tuple(keys), tuple(blocks)))
            state.held = True

    def loads_ended(self, request_ids: Iterable[str]) -> None:
        """The workers reported these requests' loads ended: each one's pages over the seconds
        since its lookup asked the tier go to ``restored`` (what admitting the prefix
        cost the request: the lookup's round trip, vLLM's steps until the load started and
        ended, the load itself)."""
        now = self._clock()
        for request_id in request_ids:
            state = self._requests.get(request_id)
            if state is None or not state.loading:
                continue
            pages, state.loading = state.loading, 0
            if self._restored is not None and state.asked_at is not None:
                try:
                    self._restored(pages, now - state.asked_at)
                except Exception as err:  # the figures are a hint, never a dead scheduler
                    log.warning("kvcr_policy: recording a restore failed: %s", err)

    def finished(self, request: Any) -> bool:
        """Forget ``request``; True when vLLM must keep its blocks until the workers report."""
        self._asked.pop(request.request_id, None)
        self._running.discard(request.request_id)
        state = self._requests.pop(request.request_id, None)
        return bool(state and state.held)

    def take_stats(self) -> dict[str, int]:
        if not self.stats:
            return {}
        stats, self.stats = dict(self.stats), Counter()
        return stats

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
