"""Free-run allocator of a store's tier: free slots kept as maximal runs, and run counting.

:class:`~.store.Store` takes slots from :class:`_FreeExtents` and gives them back;
:func:`count_extents` counts the runs in a list of slots (the copies a restore needs).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["count_extents"]


def count_extents(slots: np.ndarray | Sequence[int]) -> int:
    """Count the runs of consecutive ascending slots in ``slots``, in order; -1 entries (misses)
    belong to no run. A prefix restored from ``k`` extents needs ``k`` copies, not one per page."""
    s = np.asarray(slots, dtype=np.int64).ravel()
    if s.size == 0:
        return 0
    valid = s >= 0
    starts = valid.copy()
    starts[1:] &= ~(valid[:-1] & (s[1:] == s[:-1] + 1))
    return int(np.count_nonzero(starts))


class _FreeExtents:
    """Free slots as maximal runs: parallel lists of starts (sorted) and lengths. Freed runs
    merge with their neighbours, so the allocator keeps finding long runs after churn. ``give``
    costs a bisection and a list insert or delete (a C memmove) per run; ``take`` scans the
    runs, in one vectorised pass once a fragmented tier has many of them."""

    __slots__ = ("_lengths", "_starts", "free")

    # Measured (2 cores, Python 3.11, numpy 2.4) on a scan where no run fits, then the sort:
    # Python and numpy tie at 128 runs, numpy is 1.2x faster at 256 and 1.8x at 1,024; with
    # fewer runs, or a fit found early, the Python scan wins.
    _VECTOR_SCAN_FROM = 256

    def __init__(self, capacity: int) -> None:
        self._starts: list[int] = [0]
        self._lengths: list[int] = [capacity]
        self.free = capacity

    def __len__(self) -> int:
        return len(self._starts)

    def runs(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self._starts, self._lengths, strict=True))

    def take(self, count: int) -> Sequence[int]:
        """Slots for ``count`` consecutive keys: the first run that fits them all (a range),
        else the fewest runs (largest first), handed out in slot order. Caller ensures count
        <= free."""
        if count == 0:
            return []
        starts, lengths = self._starts, self._lengths
        vectorised = len(lengths) >= self._VECTOR_SCAN_FROM
        if vectorised:
            sizes = np.array(lengths, dtype=np.int64)
            fits = np.flatnonzero(sizes >= count)
            index = int(fits[0]) if fits.size else -1
        else:
            index = next((i for i, length in enumerate(lengths) if length >= count), -1)
        if index >= 0:
            first = starts[index]
            self._carve(index, count)
            return range(first, first + count)
        # Largest first gives the fewest runs; both sorts are stable, so among equal lengths
        # the lower start wins, as first fit would.
        if vectorised:
            by_size: list[int] = np.argsort(-sizes, kind="stable").tolist()
        else:
            by_size = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
        chosen: list[tuple[int, int, int]] = []  # (start, size, index)
        remaining = count
        for index in by_size:
            size = min(lengths[index], remaining)
            chosen.append((starts[index], size, index))
            remaining -= size
            if remaining == 0:
                break
        # Carve from the highest index down, so removing a run keeps the lower indices valid.
        for _, size, index in sorted(chosen, key=lambda run: run[2], reverse=True):
            self._carve(index, size)
        chosen.sort()
        return [slot for first, size, _ in chosen for slot in range(first, first + size)]

    def _carve(self, index: int, size: int) -> None:
        if size < self._lengths[index]:
            # The remainder keeps the run's place in the sorted list.
            self._starts[index] += size
            self._lengths[index] -= size
        else:
            del self._starts[index]
            del self._lengths[index]
        self.free -= size

    def give(self, slots: Iterable[int]) -> None:
        """Return slots (any order, no duplicates, none already free)."""
        given = slots if isinstance(slots, list | np.ndarray) else list(slots)
        ordered = np.sort(np.asarray(given, dtype=np.int64))
        if not len(ordered):
            return
        # The runs in a few array operations: an eviction gives back thousands of slots.
        breaks = np.flatnonzero(np.diff(ordered) != 1)
        firsts = ordered[np.concatenate(([0], breaks + 1))].tolist()
        lasts = ordered[np.concatenate((breaks, [len(ordered) - 1]))].tolist()
        for first, last in zip(firsts, lasts, strict=True):
            self._give_run(first, last + 1)

    def _give_run(self, start: int, end: int) -> None:
        starts, lengths = self._starts, self._lengths
        self.free += end - start
        index = bisect_left(starts, start)  # where the run goes; its right neighbour is here
        if index < len(starts) and starts[index] == end:
            end += lengths[index]
            del starts[index]
            del lengths[index]
        if index > 0 and starts[index - 1] + lengths[index - 1] == start:
            lengths[index - 1] = end - starts[index - 1]  # grow the left neighbour in place
        else:
            starts.insert(index, start)
            lengths.insert(index, end - start)
