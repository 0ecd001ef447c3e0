"""The replay model: a trace's prefix hits in a tier of a given capacity, block by block.

The definition, followed exactly (the README states it too):

- capacity in blocks = ``floor(capacity_tokens / block_tokens)``;
- a request's hit tokens = ``min(block_tokens * k, input_length)``, where ``k`` is the number of
  its leading ``hash_ids`` present before the request;
- then every block of the request is inserted or touched, in order: the ``k`` hits are touched
  (the restore), then the rest are written (a present block touched, an absent one inserted);
- hit rate = sum of hit tokens / sum of input tokens.

Where the definition leaves a choice, the model does what a pipeline does, so that
``plan --trace --bytes`` (the same requests through a real pipeline) finds exactly the same
hits: the room the rest needs is made first, evicting in the eviction policy's order any
block but the rest's present ones; if even that is short, only the rest's leading blocks that
fit are written. A block repeated within a request (never in Mooncake's traces, where an id
names its whole prefix) is written once, and restored once per occurrence, first occurrences
first (the pipeline reads repeated keys round after round).
The eviction policy is the configured strategy's own object, called as the store calls it.

Memory is bounded by the capacity (the blocks held, and what the policy keeps); the trace is
read, never copied. Cost: about a microsecond per block reference on one core.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass

from ..strategies import EvictionPolicy
from .trace import Trace

__all__ = ["Replay", "replay", "replay_unbounded"]


@dataclass(frozen=True, slots=True)
class Replay:
    """What a replay found: hits (tokens and leading blocks), inputs and evictions."""

    capacity_blocks: int | None  # None: no capacity limit
    requests: int
    input_tokens: int
    hit_tokens: int
    hit_blocks: int
    evictions: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.input_tokens if self.input_tokens else 0.0


def _rounds(blocks: list[int]) -> list[int]:
    """A restore's uses when a block repeats: first occurrences in order, then second ones, ...
    (the pipeline reads repeated keys round after round, :func:`kvcr_policy.keys.rounds`)."""
    seen: dict[int, int] = {}
    numbered = []
    for position, block_id in enumerate(blocks):
        seen[block_id] = seen.get(block_id, -1) + 1
        numbered.append((seen[block_id], position, block_id))
    return [block_id for _, _, block_id in sorted(numbered)]


def _lookups(trace: Trace, held: Container[int]) -> Iterator[tuple[list[int], int, int]]:
    """Each request's block ids, how many lead in ``held`` (``k``, looked up as the request
    comes: after the caller has handled the one before) and the tokens they hit."""
    block, ids, starts, inputs = trace.block_tokens, trace.ids, trace.starts, trace.inputs
    for request in range(len(inputs)):
        blocks = ids[starts[request] : starts[request + 1]].tolist()
        k = 0
        for block_id in blocks:
            if block_id not in held:
                break
            k += 1
        yield blocks, k, min(block * k, inputs[request])


def _not_in(kept: set[int]) -> Callable[[int], bool]:
    """Evictable: any slot but those the write keeps (its present blocks), as the store says."""
    return lambda slot: slot not in kept


def replay(trace: Trace, capacity_blocks: int, policy: EvictionPolicy) -> Replay:
    """Replay ``trace`` in a tier of ``capacity_blocks`` blocks evicting with ``policy``."""
    if capacity_blocks < 1:
        raise ValueError(f"capacity_blocks must be at least 1, got {capacity_blocks}")
    admit, touch, forget, victims = policy.admit, policy.touch, policy.forget, policy.victims
    present: dict[int, int] = {}  # block id -> slot
    owner: dict[int, int] = {}  # slot -> block id
    freed: list[int] = []
    fresh = 0  # slots never used yet: 0 .. fresh-1 have been handed out
    hit_tokens = hit_blocks = evictions = 0
    for blocks, k, hit in _lookups(trace, present):
        hit_blocks += k
        hit_tokens += hit
        for block_id in blocks[:k] if k == len(set(blocks[:k])) else _rounds(blocks[:k]):
            touch(present[block_id])  # the restore: each hit used
        rest = list(dict.fromkeys(blocks[k:]))  # the write
        if not rest:
            continue
        absent = [position for position, block_id in enumerate(rest) if block_id not in present]
        room = capacity_blocks - len(present)
        if room < len(absent):
            kept = {present[block_id] for block_id in rest if block_id in present}
            chosen = victims(len(absent) - room, _not_in(kept))
            for slot in chosen:
                del present[owner.pop(slot)]
                forget(slot)
                freed.append(slot)
            evictions += len(chosen)
            room += len(chosen)
        cover = absent[room] if room < len(absent) else len(rest)
        for block_id in rest[:cover]:
            held = present.get(block_id)
            if held is not None:
                touch(held)
                continue
            if freed:
                slot = freed.pop()
            else:
                slot, fresh = fresh, fresh + 1
            present[block_id] = slot
            owner[slot] = block_id
            admit(slot, block_id)
    return Replay(
        capacity_blocks, trace.requests, trace.input_tokens, hit_tokens, hit_blocks, evictions
    )


def replay_unbounded(trace: Trace) -> Replay:
    """The replay with no capacity limit: every block stays once seen (the most hits)."""
    seen: set[int] = set()
    hit_tokens = hit_blocks = 0
    for blocks, k, hit in _lookups(trace, seen):
        hit_blocks += k
        hit_tokens += hit
        seen.update(blocks)
    return Replay(None, trace.requests, trace.input_tokens, hit_tokens, hit_blocks, 0)
