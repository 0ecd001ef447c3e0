"""count_batches: how a batching strategy cuts a restore of ``pages`` pages, counted, not listed.

A strategy's ``read_batches(n)`` lists every ``[start, stop)`` range, which is right for a
call the mover runs (its pages are in a pool) but not for a plan about a prefix of 10**12
tokens: the list alone would not fit in memory. So a large prefix is counted from a sample:
the strategy cuts :data:`SAMPLE_PAGES` pages, and a strategy whose batches settle on one size
after a ramp (every built-in, and the example plugin's adaptive one: a first small batch,
doubling) is extrapolated exactly: the ramp as sampled, then whole batches of the settled size,
then the rest. A strategy that does not settle, or whose first batches depend on the total
(checked against a sample of half the size), is refused for prefixes above the sample, with a
message naming the bound.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..builtin.batching import joined

__all__ = ["SAMPLE_PAGES", "BatchCounts", "count_batches"]

#: Pages of the sample a large prefix is extrapolated from: at most this many ranges are ever
#: listed (a few MiB of tuples), at least 4 batches of the largest read_batch_pages (65,536).
SAMPLE_PAGES = 1 << 18


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """Batches of one restore: how many batches of each size (pages per batch)."""

    sizes: dict[int, int]

    @property
    def total(self) -> int:
        return sum(self.sizes.values())

    @property
    def largest(self) -> int:
        return max(self.sizes, default=0)


def _sizes(ranges: list[tuple[int, int]]) -> list[int]:
    return [stop - start for start, stop in ranges]


def count_batches(batching: Any, pages: int, least: int = 1) -> BatchCounts | None:
    """The batches ``batching.read_batches(pages)`` would make, joined until each holds
    ``least`` pages (``batching.read_batch_bytes``, as the mover joins them); None when they
    cannot be counted without listing more than :data:`SAMPLE_PAGES` pages (see the module
    docstring)."""

    def cut(n: int) -> list[int]:
        return _sizes(joined(batching.read_batches(n), least))

    if pages <= SAMPLE_PAGES:
        return BatchCounts(dict(Counter(cut(pages))))
    sample = cut(SAMPLE_PAGES)
    half = cut(SAMPLE_PAGES // 2)
    if len(sample) < 3 or len(half) < 2 or half[:-1] != sample[: len(half) - 1]:
        return None  # too few batches to see a pattern, or the cut depends on the total
    steady = sample[-2]  # the last whole batch (the last one may be a remainder)
    first = len(sample) - 2
    while first > 0 and sample[first - 1] == steady:
        first -= 1
    if first > len(sample) - 3 or steady <= 0:
        return None  # no two whole batches of one size: the strategy has not settled
    counts = Counter(sample[:first])
    rest = pages - sum(sample[:first])
    counts[steady] += rest // steady
    if rest % steady:
        counts[rest % steady] += 1
    return BatchCounts(dict(counts))
