"""The trace's first requests as token-id prompts: no tokenizer, no text, no download.

Every block id of a request becomes ``block_tokens`` token ids drawn from a generator seeded
by the id, so equal ids give equal tokens (and equal prefixes equal KV), and a request keeps
its share of its last block (``input_length`` scaled by ``block_tokens / 512``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..plan.trace import read_trace

__all__ = ["TRACE_BLOCK", "Prompt", "prompts"]

TRACE_BLOCK = 512  # tokens per block id in Mooncake's traces
FIRST_TOKEN = 3  # ids below are special tokens (bos, eos, ...)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request: its number in the trace, block ids and token ids."""

    number: int
    hash_ids: tuple[int, ...]
    tokens: tuple[int, ...]


def _block(block_id: int, block_tokens: int, vocab: int) -> np.ndarray:
    rng = np.random.default_rng(block_id)
    return rng.integers(FIRST_TOKEN, vocab, block_tokens, dtype=np.int64)


def prompts(trace: Path, count: int, block_tokens: int, vocab: int) -> list[Prompt]:
    """The first ``count`` requests of ``trace`` (fewer if it is shorter)."""
    read = read_trace(trace)
    made: list[Prompt] = []
    for number in range(min(count, read.requests)):
        ids = tuple(int(x) for x in read.ids[read.starts[number] : read.starts[number + 1]])
        length = math.ceil(read.inputs[number] * block_tokens / TRACE_BLOCK)
        length = max(1, min(length, len(ids) * block_tokens))
        blocks = [_block(block_id, block_tokens, vocab) for block_id in ids]
        tokens = np.concatenate(blocks)[:length] if blocks else np.zeros(0, np.int64)
        made.append(Prompt(number, ids, tuple(int(t) for t in tokens)))
    return made
