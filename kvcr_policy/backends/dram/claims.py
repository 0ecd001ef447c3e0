"""Claim counts of a store's slots, changed many slots per call (numpy, no loop per slot).

A read claims the slots of its leading present run (1,812 of them for a 116k-token MLA
restore) and releases them all once its copies are done; a store does both under its lock, so
what they cost per slot is time before the first copy can start and after the last one ends.
:class:`ClaimCounts` does each as a few array operations over the call's slots, with the
result of claiming or releasing them one at a time: a slot named twice counts twice, and a
release never takes a count below zero.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["ClaimCounts"]

Int64Array = npt.NDArray[np.int64]


class ClaimCounts:
    """Claims per slot (``counts``, int64) and how many slots hold at least one (``claimed``).

    Not thread-safe: the store calls it under its own lock.
    """

    __slots__ = ("claimed", "counts")

    def __init__(self, capacity: int) -> None:
        self.counts: Int64Array = np.zeros(capacity, dtype=np.int64)
        self.claimed = 0

    def __getitem__(self, slot: int) -> int:
        return int(self.counts[slot])

    def add(self, slots: Int64Array, distinct: bool = False) -> None:
        """One more claim on each entry of ``slots`` (an entry named twice counts twice).
        ``distinct``: the caller knows no slot is named twice (a read's claim: one slot per
        key, the keys distinct), so no sort is needed."""
        if len(slots) == 0:
            return
        counts = self.counts
        if distinct:
            held = counts[slots]
            self.claimed += int(np.count_nonzero(held == 0))
            counts[slots] = held + 1
            return
        unique, repeats = np.unique(slots, return_counts=True)
        held = counts[unique]
        self.claimed += int(np.count_nonzero(held == 0))
        counts[unique] = held + repeats

    def remove(self, slots: Int64Array, distinct: bool = False) -> Int64Array:
        """One claim fewer on each entry of ``slots``, none below zero (an entry whose slot
        holds no claim any more is skipped); returns the slots left with none, ascending.
        ``distinct`` as for :meth:`add`."""
        if len(slots) == 0:
            return slots
        counts = self.counts
        if distinct:
            held = counts[slots]
            counts[slots] = np.maximum(held - 1, 0)
            freed: Int64Array = np.sort(slots[held == 1])
            self.claimed -= len(freed)
            return freed
        unique, repeats = np.unique(slots, return_counts=True)
        held = counts[unique]
        counts[unique] = np.maximum(held - repeats, 0)
        emptied: Int64Array = unique[(held > 0) & (held <= repeats)]
        self.claimed -= len(emptied)
        return emptied
