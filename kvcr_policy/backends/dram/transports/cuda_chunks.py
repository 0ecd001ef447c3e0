"""Cheap whole-batch checks and chunking for the staging ring (numpy only, no GPU needed).

A batch is planned and enqueued in growing chunks (:func:`chunk_bounds`): on an idle GPU the
first copy starts once a couple of ring buffers' worth is planned, and each later chunk is
planned while the copies before it run, so a restore does not wait for its whole first batch
to be planned before PCIe starts, nor a later batch for its whole plan. Chunks are cut in the
order the descriptors come in, which for a tier laid out slot by slot is slot by slot:
:func:`host_runs` counts its contiguous host runs without a sort. Chunks run one after
another, so each checks only its own writes (its plan does); a batch that must be sorted by
host offset first is checked whole by :func:`overlapping`, linear in the common shapes.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

__all__ = ["any_remainder", "chunk_bounds", "host_runs", "overlapping", "repeats"]

Int64Array = npt.NDArray[np.int64]


def host_runs(host: Int64Array, length: Int64Array) -> int:
    """Runs of host-contiguous descriptors in the order given: what
    :func:`.cuda_staging.host_spans` counts, without its sort, which descriptors laid out
    slot by slot need not pay."""
    if len(host) == 0:
        return 0
    return 1 + int(np.count_nonzero(host[1:] != host[:-1] + length[:-1]))


#: Repeats are found with a bitmap while it takes at most this many bytes per value (else by
#: sorting).
_BITMAP_PER_VALUE = 64


def repeats(values: Int64Array) -> bool:
    """Whether some value appears twice: a bitmap over their range while it is at most
    :data:`_BITMAP_PER_VALUE` times their count (a pool's fragments, tier slots), else a sort."""
    if len(values) < 2:
        return False
    low, high = int(values.min()), int(values.max())
    if high - low < _BITMAP_PER_VALUE * len(values):
        seen = np.zeros(high - low + 1, dtype=bool)
        seen[values - low] = True
        return int(np.count_nonzero(seen)) != len(values)
    ordered = np.sort(values)
    return bool(np.any(ordered[1:] == ordered[:-1]))


def any_remainder(values: Int64Array, divisor: int) -> bool:
    """Whether some value is not a multiple of ``divisor`` (> 0); a mask for a power of two,
    several times faster than ``%``."""
    if divisor & (divisor - 1) == 0:
        return bool(np.any(values & (divisor - 1)))
    return bool(np.any(values % divisor))


def overlapping(offsets: Int64Array, length: Int64Array) -> bool:
    """Whether two of the ranges ``[offsets[i], offsets[i] + length[i])`` share a byte.

    Linear when the offsets ascend, or when every range has one length and starts at a
    multiple of it (the fragments of a pool or of tier slots: :func:`repeats` of starts);
    else by sorting.
    """
    mask = length > 0
    if not mask.all():
        offsets, length = offsets[mask], length[mask]
    if len(offsets) < 2:
        return False
    if not np.all(offsets[1:] >= offsets[:-1]):
        size = int(length[0])
        if np.all(length == size) and not any_remainder(offsets, size):
            return repeats(offsets // size)  # equal aligned ranges overlap where they start
        order = np.argsort(offsets, kind="stable")
        offsets, length = offsets[order], length[order]
    # The gap to the next start (sorted: never negative), not start + length, which wraps.
    return bool(np.any(offsets[1:] - offsets[:-1] < length[:-1]))


def chunk_bounds(
    length: Int64Array, first_bytes: int | None, next_bytes: int | None = None
) -> list[tuple[int, int]]:
    """Descriptor ranges ``[lo, hi)`` to plan and enqueue one after another: the first about
    ``first_bytes``, the second about ``next_bytes`` (``first_bytes`` when None), each next one
    twice the last, so planning a chunk takes less time than copying the one before it (a
    plan's cost is mostly fixed, so the second chunk, planned while the first copies, is no
    larger than it); one range for everything when ``first_bytes`` is None."""
    n = len(length)
    if first_bytes is None or n == 0:
        return [(0, n)]
    size = int(length[0])
    uniform = size > 0 and not np.any(length != size)  # a pool's fragments: no prefix sums
    ends = None if uniform else np.cumsum(length)
    total = size * n if ends is None else int(ends[-1])
    cuts, step, target = [], next_bytes or first_bytes, first_bytes
    while target < total:
        cuts.append(target)
        target += step
        step *= 2
    wanted = np.asarray(cuts, dtype=np.int64)
    # The descriptor that reaches each cut: ceil(cut / size) when they are all one size.
    reach = -(-wanted // size) if ends is None else np.searchsorted(ends, wanted, side="left") + 1
    edges = [0, *sorted({int(x) for x in reach if 0 < x < n}), n]
    return list(itertools.pairwise(edges))
