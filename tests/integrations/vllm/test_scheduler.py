"""The connector's scheduler half on its own: lookups that never block, what a step plans.

vLLM's ``Request`` and ``SchedulerOutput`` are stood in by plain objects with the same fields
(the whole connector runs inside a real vLLM engine in ``test_connector.py``); the lookup is a
counter the test controls, so the order of events is the test's, not a thread's.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from kvcr_policy.admission import AdmissionDesk
from kvcr_policy.integrations.vllm.keys import block_keys
from kvcr_policy.integrations.vllm.scheduler import SchedulerHalf
from kvcr_policy.strategies import Admission

BLOCK = 4


class Tier:
    """Present keys; ``gate`` holds every lookup until the test opens it."""

    def __init__(self, present: set[str]) -> None:
        self.present = present
        self.gate = threading.Event()

    def __call__(self, keys: list[str]) -> int:
        self.gate.wait(10)
        found = 0
        while found < len(keys) and keys[found] in self.present:
            found += 1
        return found


def request(rid: str, tokens: list[int]) -> Any:
    return SimpleNamespace(request_id=rid, prompt_token_ids=tokens)


def ask(half: SchedulerHalf, req: Any, computed: int) -> tuple[int | None, bool]:
    for _ in range(1000):
        answer = half.matched(req, computed)
        if answer[0] is not None:
            return answer
        threading.Event().wait(0.01)
    raise AssertionError("the lookup never finished")


def test_a_lookup_answers_later_instead_of_waiting_on_the_tier() -> None:
    tokens = list(range(4 * BLOCK + 1))
    tier = Tier(set(block_keys(tokens, BLOCK, "p:", 10)))
    half = SchedulerHalf(BLOCK, "p:", tier)
    req = request("r", tokens)
    assert half.matched(req, 0) == (None, False)  # the tier has not answered: ask again
    tier.gate.set()
    assert ask(half, req, 0) == (4 * BLOCK, True)
    assert half.take_stats() == {"lookups": 1, "lookup_pages": 4, "hit_pages": 4}
    assert half.take_stats() == {}  # per interval
    half.close()


def test_with_no_other_request_running_a_lookup_waits_for_its_answer() -> None:
    # An idle vLLM calls the lookup again at once, each call taking the lock the lookup
    # thread needs: with nothing else to run, the call waits for the answer (bounded), so the
    # request is scheduled in this step.
    tokens = list(range(4 * BLOCK + 1))
    tier = Tier(set(block_keys(tokens, BLOCK, "p:", 10)))
    tier.gate.set()
    half = SchedulerHalf(BLOCK, "p:", tier, idle_wait_s=60.0)
    assert half.matched(request("r", tokens), 0) == (4 * BLOCK, True)  # first call: answered
    half.close()


def test_with_another_request_running_a_lookup_never_waits() -> None:
    tokens = list(range(4 * BLOCK + 1))
    tier = Tier(set(block_keys(tokens, BLOCK, "p:", 10)))  # held until the test opens it
    half = SchedulerHalf(BLOCK, "p:", tier, idle_wait_s=60.0)
    other = SimpleNamespace(
        req_id="o", prompt_token_ids=list(range(BLOCK + 1)), block_ids=([1],), num_computed_tokens=0
    )
    half.plan(output([other], scheduled={"o": BLOCK + 1}))  # vLLM runs "o"
    req = request("r", tokens)
    assert half.matched(req, 0) == (None, False)  # at once: "o" has steps to run
    half.finished(SimpleNamespace(request_id="o"))
    tier.gate.set()  # "o" finished: nothing else to run, the next call waits for the answer
    assert half.matched(req, 0) == (4 * BLOCK, True)
    half.close()


def test_the_last_token_is_always_left_to_compute() -> None:
    tokens = list(range(4 * BLOCK))  # four full blocks, all present
    tier = Tier(set(block_keys(tokens, BLOCK, "p:", 10)))
    tier.gate.set()
    half = SchedulerHalf(BLOCK, "p:", tier)
    assert ask(half, request("r", tokens), 0) == (3 * BLOCK, True)
    half.close()


def test_a_partial_hit_loads_the_leading_run_beyond_vllms_own_hit() -> None:
    tokens = list(range(6 * BLOCK + 2))
    keys = block_keys(tokens, BLOCK, "p:", 10)
    tier = Tier({keys[1], keys[2], keys[4]})  # block 3 is missing
    tier.gate.set()
    half = SchedulerHalf(BLOCK, "p:", tier)
    req = request("r", tokens)
    assert ask(half, req, BLOCK) == (2 * BLOCK, True)  # vLLM holds block 0: blocks 1-2 load
    half.allocated(req, [10, 11, 12, 13, 14, 15, 16], 2 * BLOCK)
    plan = half.plan(output([]))
    assert [(job.keys, job.block_ids) for job in plan.loads] == [((keys[1], keys[2]), (11, 12))]
    assert half.finished(req) is True  # vLLM keeps the blocks until the worker reports
    half.close()


def output(new: list[Any], cached: Any = None, scheduled: dict[str, int] | None = None) -> Any:
    cached = cached or SimpleNamespace(
        req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[]
    )
    return SimpleNamespace(
        scheduled_new_reqs=new, scheduled_cached_reqs=cached, num_scheduled_tokens=scheduled or {}
    )


def test_each_computed_full_prompt_block_is_saved_once() -> None:
    tokens = list(range(5 * BLOCK + 1))
    keys = block_keys(tokens, BLOCK, "p:", 10)
    half = SchedulerHalf(BLOCK, "p:", Tier(set()))
    new = SimpleNamespace(
        req_id="r", prompt_token_ids=tokens, block_ids=([7, 8, 9],), num_computed_tokens=BLOCK
    )
    # Step 1: vLLM had block 0; the chunk computes 2 blocks and a half.
    plan = half.plan(output([new], scheduled={"r": 2 * BLOCK + 2}))
    assert [(j.keys, j.block_ids) for j in plan.saves] == [((keys[1], keys[2]), (8, 9))]
    assert plan.prefill_tokens == 2 * BLOCK + 2  # a step of new requests only: timed
    # ... with what its attention spans: the new tokens over the block vLLM had.
    assert plan.prefill_squares == (3 * BLOCK + 2) ** 2 - BLOCK**2
    # Step 2: the rest of the prompt and a generated token; new blocks appended.
    cached = SimpleNamespace(
        req_ids=["r"],
        new_block_ids=[([20, 21],)],
        resumed_req_ids=set(),
        num_computed_tokens=[3 * BLOCK + 2],
    )
    plan = half.plan(output([], cached, {"r": 3 * BLOCK}))
    assert [(j.keys, j.block_ids) for j in plan.saves] == [((keys[3], keys[4]), (20, 21))]
    assert plan.prefill_tokens == plan.prefill_squares == 0  # not a prefill of its own
    assert half.finished(SimpleNamespace(request_id="r")) is True
    half.close()


def test_a_request_with_nothing_moved_is_not_held() -> None:
    half = SchedulerHalf(BLOCK, "p:", Tier(set()))
    new = SimpleNamespace(
        req_id="r", prompt_token_ids=[1, 2], block_ids=([3],), num_computed_tokens=0
    )
    assert half.plan(output([new], scheduled={"r": 2})).saves == ()
    assert half.finished(SimpleNamespace(request_id="r")) is False
    half.close()


def test_a_failing_tier_is_a_miss() -> None:
    def broken(keys: list[str]) -> int:
        raise OSError("gone")

    half = SchedulerHalf(BLOCK, "p:", broken)
    assert ask(half, request("r", list(range(3 * BLOCK))), 0) == (0, False)
    half.close()


class DeclineAll:
    """An admission strategy that declines every present page (the test's decision)."""

    def admit(self, found: int, page_tokens: int, page_bytes: int, outlook: Any) -> Admission:
        return Admission(0, "declined", "declined")


def test_blocks_present_but_declined_by_the_gate_are_computed_and_not_saved_again() -> None:
    tokens = list(range(5 * BLOCK + 1))
    keys = block_keys(tokens, BLOCK, "p:", 10)
    desk = AdmissionDesk(DeclineAll())  # the pipeline's admission, as the connector asks it

    def lookup(asked: list[str]) -> tuple[int, int]:  # 3 present, none admitted
        return 3, desk.decide("kv", 3, BLOCK, 1024, None, asked)

    half = SchedulerHalf(BLOCK, "p:", lookup, lambda keys: desk.declined.split("kv", keys))
    req = request("r", tokens)
    assert ask(half, req, 0) == (0, False)  # nothing to load: vLLM computes
    new = SimpleNamespace(
        req_id="r", prompt_token_ids=tokens, block_ids=([1, 2, 3, 4, 5],), num_computed_tokens=0
    )
    plan = half.plan(output([new], scheduled={"r": 5 * BLOCK + 1}))
    assert [(j.keys, j.block_ids) for j in plan.saves] == [((keys[3], keys[4]), (4, 5))]
    assert desk.declined.skipped == 3 and len(desk.declined) == 0  # each left out once
    half.close()


def test_a_lookup_the_gate_declines_is_answered_and_counted_at_once_without_the_tier() -> None:
    tokens = list(range(5 * BLOCK + 1))
    keys = block_keys(tokens, BLOCK, "p:", 10)
    tier = Tier(set(keys[:3]))  # holds every lookup until the test opens it: never opened
    desk = AdmissionDesk(DeclineAll())
    asked: list[list[str]] = []

    def lookup(keys: list[str]) -> tuple[int, int]:
        asked.append(keys)
        return tier(keys), 0

    def declines(pages: int) -> Admission | None:  # as the connector's: decides and counts
        return desk.declines("kv", pages, BLOCK, 1024, None)

    half = SchedulerHalf(BLOCK, "p:", lookup, lambda k: desk.declined.split("kv", k), declines)
    req = request("r", tokens)
    assert half.matched(req, 0) == (0, False)  # no hit, without waiting for the tier
    assert desk.counts == {("declined", "declined"): 5}  # every asked page, at once
    half.close()
    assert asked == []  # the tier was never asked
    assert half.take_stats() == {
        "lookups": 1, "lookup_pages": 5, "hit_pages": 0, "declined_at_once": 1
    }  # fmt: skip


def test_a_lookup_the_gate_may_admit_waits_for_the_tier() -> None:
    tokens = list(range(4 * BLOCK + 1))
    tier = Tier(set(block_keys(tokens, BLOCK, "p:", 10)))
    asked: list[int] = []

    def declines(pages: int) -> None:
        asked.append(pages)  # the gate would admit some: the tier is asked

    half = SchedulerHalf(BLOCK, "p:", tier, None, declines)
    req = request("r", tokens)
    assert half.matched(req, 0) == (None, False)
    tier.gate.set()
    assert ask(half, req, 0) == (4 * BLOCK, True)
    assert asked == [4]  # once a lookup, not once an ask
    half.close()


def test_a_gate_that_fails_to_decide_leaves_the_lookup_to_the_tier() -> None:
    tokens = list(range(2 * BLOCK + 1))
    tier = Tier(set(block_keys(tokens, BLOCK, "p:", 10)))
    tier.gate.set()

    def declines(pages: int) -> None:
        raise RuntimeError("pipeline is closed")

    half = SchedulerHalf(BLOCK, "p:", tier, None, declines)
    assert ask(half, request("r", tokens), 0) == (2 * BLOCK, True)
    half.close()


@pytest.mark.parametrize("save", [False, True])
def test_a_request_the_gate_declined_is_not_asked_again_and_its_saves_follow_the_decision(
    save: bool,
) -> None:
    tokens = list(range(5 * BLOCK + 1))
    keys = block_keys(tokens, BLOCK, "p:", 10)
    tier = Tier(set())
    tier.gate.set()
    asked: list[int] = []

    def declines(pages: int) -> Admission:
        asked.append(pages)
        return Admission(0, "computes_sooner", "computes_sooner", save=save)

    half = SchedulerHalf(BLOCK, "p:", lambda k, d=None: (tier(k), 0), None, declines)
    req = request("r", tokens)
    assert half.matched(req, 0) == (0, False)
    assert half.matched(req, 0) == (0, False)  # vLLM had no room: asked again
    assert asked == [5]  # the gate once, the tier once (below)
    new = SimpleNamespace(
        req_id="r", prompt_token_ids=tokens, block_ids=([1, 2, 3, 4, 5],), num_computed_tokens=0
    )
    plan = half.plan(output([new], scheduled={"r": 5 * BLOCK + 1}))
    saved = [(j.keys, j.block_ids) for j in plan.saves]
    assert saved == ([(tuple(keys), (1, 2, 3, 4, 5))] if save else [])
    assert half.finished(req) is save  # no save planned: vLLM frees the blocks at once
    stats = half.take_stats()
    assert stats["lookups"] == 1 and stats.get("unsaved_pages", 0) == (0 if save else 5)
    half.close()


def test_a_restore_is_timed_from_the_lookup_that_asked_to_the_end_of_its_load() -> None:
    """What admitting cost the request: from the lookup that asked the tier (its round trip,
    vLLM's steps until the load starts) to the workers' report that the load ended; the
    clock is the test's."""
    tokens = list(range(4 * BLOCK + 1))
    tier = Tier(set(block_keys(tokens, BLOCK, "p:", 10)))
    tier.gate.set()
    now = [100.0]
    restored: list[tuple[int, float]] = []
    half = SchedulerHalf(
        BLOCK, "p:", tier, restored=lambda p, s: restored.append((p, s)), clock=lambda: now[0]
    )
    req = request("r", tokens)
    assert ask(half, req, 0) == (4 * BLOCK, True)  # asked at 100.0
    now[0] = 100.25
    half.allocated(req, list(range(10, 14)), 4 * BLOCK)
    half.loads_ended(["other"])  # another request's load: nothing of this one
    assert restored == []
    now[0] = 100.5
    half.loads_ended(["r"])
    assert restored == [(4, 0.5)]
    half.loads_ended(["r"])  # reported once
    assert restored == [(4, 0.5)]
    half.close()


def test_a_failing_restore_record_leaves_the_scheduler_running() -> None:
    tokens = list(range(2 * BLOCK + 1))
    tier = Tier(set(block_keys(tokens, BLOCK, "p:", 10)))
    tier.gate.set()

    def restored(pages: int, seconds: float) -> None:
        raise RuntimeError("pipeline is closed")

    half = SchedulerHalf(BLOCK, "p:", tier, restored=restored)
    req = request("r", tokens)
    assert ask(half, req, 0) == (2 * BLOCK, True)
    half.allocated(req, [1, 2], 2 * BLOCK)
    half.loads_ended(["r"])  # logged, not raised
    half.close()
