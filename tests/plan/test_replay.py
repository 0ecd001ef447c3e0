"""The replay model: a worked example of the definition, a plain reference it must match for
LRU and FIFO, and the bounds every replay keeps (never above the unbounded replay, equal to it
once every block fits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.builtin.eviction import FIFOPolicy, LRUPolicy
from kvcr_policy.plan.replay import replay, replay_unbounded
from kvcr_policy.plan.trace import Trace, read_trace
from tests.strategies import trace_requests

# (hash_ids, input_length): the worked example below follows it request by request.
EXAMPLE = [([1, 2, 3], 1500), ([1, 2, 4], 1536), ([1, 2, 3], 1400), ([5, 1], 700),
           ([2], 100), ([5, 1, 2], 1536)]  # fmt: skip


def _trace(tmp_path: Path, requests: list[dict[str, object]]) -> Trace:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in requests), encoding="utf-8")
    return read_trace(path)


def _example(tmp_path: Path) -> Trace:
    rows = [
        {"timestamp": i, "input_length": n, "hash_ids": ids} for i, (ids, n) in enumerate(EXAMPLE)
    ]
    return _trace(tmp_path, rows)


def test_the_worked_example_with_lru(tmp_path: Path) -> None:
    # Capacity 3 blocks, least recent first after each request:
    # 1: no hit; 1 2 3.          2: hits 1 2 (1024 tokens); 3 goes for 4: 1 2 4.
    # 3: hits 1 2 (1024); 4 goes for 3: 1 2 3.
    # 4: [5, 1] no hit; room for 5 is made, 1 kept (present in the write): 2 goes; 3 5 1.
    # 5: [2] no hit; 3 goes: 5 1 2.   6: hits 5 1 2, 1536 tokens of 1536.
    found = replay(_example(tmp_path), 3, LRUPolicy())
    assert (found.hit_tokens, found.hit_blocks, found.evictions) == (1024 + 1024 + 1536, 7, 4)
    assert found.input_tokens == sum(n for _, n in EXAMPLE)
    assert found.hit_rate == pytest.approx(3584 / 6772)


def test_the_worked_example_with_fifo(tmp_path: Path) -> None:
    # 2: hits 1 2; 1 (first in) goes for 4: 2 3 4.   3: 1 is gone: no hit; 4 goes for 1: 2 3 1.
    # 4: no hit; 2 goes for 5: 3 1 5.   5: no hit; 3 goes: 1 5 2.   6: hits 5 1 2 (1536).
    found = replay(_example(tmp_path), 3, FIFOPolicy())
    assert (found.hit_tokens, found.hit_blocks, found.evictions) == (1024 + 1536, 5, 4)


def test_the_unbounded_example_counts_partial_last_blocks(tmp_path: Path) -> None:
    # 2: 1024; 3: three blocks but 1400 tokens; 5: one block of a 100-token prompt; 6: 1536.
    found = replay_unbounded(_example(tmp_path))
    assert found.hit_tokens == 1024 + 1400 + 100 + 1536 and found.capacity_blocks is None


def test_a_write_larger_than_the_tier_keeps_its_leading_blocks(tmp_path: Path) -> None:
    rows = [{"timestamp": 0, "input_length": 1536, "hash_ids": [1, 2, 3]}] * 2
    found = replay(_trace(tmp_path, rows), 2, LRUPolicy())
    # The first write keeps 1 and 2 (not 2 and 3), so the second request hits both; its
    # write of 3 then evicts 1.
    assert (found.hit_blocks, found.evictions) == (2, 1)


def _reference(trace: Trace, capacity: int, lru: bool) -> tuple[int, int]:
    """The definition, in lists: (hit tokens, evictions). ``order`` is least recent first."""
    order: list[int] = []
    hits = evictions = 0

    def use(block: int) -> None:
        if lru:
            order.remove(block)
            order.append(block)

    for request in range(trace.requests):
        ids = trace.blocks(request)
        k = 0
        while k < len(ids) and ids[k] in order:
            k += 1
        hits += min(trace.block_tokens * k, trace.inputs[request])
        remaining = ids[:k]  # the restore reads round after round: first occurrences, ...
        while remaining:
            firsts = list(dict.fromkeys(remaining))
            for block in firsts:
                use(block)
                remaining.remove(block)
        rest = list(dict.fromkeys(ids[k:]))
        absent = [i for i, block in enumerate(rest) if block not in order]
        short = len(absent) - (capacity - len(order))
        if short > 0:
            gone = [block for block in order if block not in rest][:short]
            order = [block for block in order if block not in gone]
            evictions += len(gone)
        room = capacity - len(order)
        cover = absent[room] if room < len(absent) else len(rest)
        for block in rest[:cover]:
            if block in order:
                use(block)
            else:
                order.append(block)
    return hits, evictions


@pytest.mark.parametrize("lru", [True, False], ids=["lru", "fifo"])
@given(requests=trace_requests(), capacity=st.integers(1, 12))
def test_the_model_matches_the_reference(
    tmp_path_factory: pytest.TempPathFactory,
    lru: bool,
    requests: list[dict[str, object]],
    capacity: int,
) -> None:
    trace = _trace(tmp_path_factory.mktemp("trace"), requests)
    found = replay(trace, capacity, LRUPolicy() if lru else FIFOPolicy())
    assert (found.hit_tokens, found.evictions) == _reference(trace, capacity, lru)


@given(requests=trace_requests(), capacity=st.integers(1, 12))
def test_no_capacity_beats_the_unbounded_replay(
    tmp_path_factory: pytest.TempPathFactory, requests: list[dict[str, object]], capacity: int
) -> None:
    trace = _trace(tmp_path_factory.mktemp("trace"), requests)
    best = replay_unbounded(trace)
    for policy in (LRUPolicy(), FIFOPolicy()):
        found = replay(trace, capacity, policy)
        assert found.hit_tokens <= best.hit_tokens
        assert found.hit_blocks <= best.hit_blocks
    every = len(set(trace.ids))
    assert replay(trace, max(1, every), LRUPolicy()).hit_tokens == best.hit_tokens


def test_a_tier_must_hold_a_block(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="capacity_blocks must be at least 1"):
        replay(_example(tmp_path), 0, LRUPolicy())
