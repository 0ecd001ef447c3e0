"""What the scheduler's half tells the workers' half each step, and the counters both keep.

The metadata crosses a process boundary under the ``mp`` executor (vLLM pickles it), so it is
plain frozen data: per load or save, the request, the page keys and vLLM's block ids.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

__all__ = ["COUNTERS", "BlockJob", "StepPlan", "count", "totals"]


@dataclass(frozen=True, slots=True)
class BlockJob:
    """Move the pages ``keys`` to or from vLLM's blocks ``block_ids`` for ``request``."""

    request: str
    keys: tuple[str, ...]
    block_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StepPlan:
    """One scheduler step's loads and saves; ``prefill_tokens``: the tokens the step
    computes when it only prefills new requests (0 when it decodes too): the worker times the
    step's forward pass for the admission gate's prefill rate; ``prefill_squares``: over
    those requests, what each one's attention spans, ``(c + t)**2 - c**2`` for ``t`` tokens
    after ``c`` computed ones (the gate fits the attention's cost apart)."""

    loads: tuple[BlockJob, ...] = ()
    saves: tuple[BlockJob, ...] = ()
    prefill_tokens: int = 0
    prefill_squares: int = 0


#: Totals since this process started, by name: what a caller in the engine's process (the
#: replay) reads; vLLM's own stats get the same numbers per interval.
COUNTERS: Counter[str] = Counter()
_LOCK = threading.Lock()


def count(**values: int) -> None:
    with _LOCK:
        COUNTERS.update(values)


def totals() -> dict[str, int]:
    with _LOCK:
        return dict(COUNTERS)
