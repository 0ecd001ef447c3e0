"""How a batch goes through the staging ring: the choice (:func:`stage`) and the plan
(:func:`plan_staging`), numpy and plain numbers, tested without a GPU.

Staging bytes are a batch's descriptors in the order given, end to end, cut into fills of one
ring buffer; each host run (consecutive descriptors that continue each other on the host: a
whole tier slot, or consecutive slots) crosses PCIe as few pieces as the fills allow, and the
device rows of every staging row say where the scatter puts it. A whole-slot tier's
descriptors come page by page, so the first fills of a read hold its first pages whether
their slots are consecutive or scattered, and :func:`page_pieces` finds those fills from the
slots alone, before the batch exists (the ring's read-ahead).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ...staging import packed
from .cuda_chunks import any_remainder, overlapping, repeats

__all__ = [
    "MAX_ROW_BYTES",
    "StagingPlan",
    "fill_pieces",
    "host_spans",
    "page_pieces",
    "plan_staging",
    "row_unit",
    "stage",
]

Int64Array = npt.NDArray[np.int64]

#: Rows are cut to at most this many bytes (a kernel's work unit; any size is correct).
MAX_ROW_BYTES = 1 << 20


def host_spans(host: Int64Array, length: Int64Array) -> tuple[int, int]:
    """``(spans, bytes)``: maximal runs of host-contiguous descriptors, once sorted by host
    offset, and the bytes they cover; what :func:`stage` decides from."""
    if len(host) == 0:
        return 0, 0
    order = np.argsort(host, kind="stable")
    h, n = host[order], length[order]
    breaks = int(np.count_nonzero(h[1:] != h[:-1] + n[:-1]))
    return breaks + 1, int(n.sum())


def stage(
    mode: str,
    *,
    descriptors: int,
    nbytes: int,
    spans: int,
    below_bytes: int,
    min_descriptors: int,
    min_span_bytes: int,
) -> bool:
    """Whether a batch goes through the staging ring.

    ``never``: no (upstream). ``always``: every batch between a GPU and the host. ``auto``: the
    batch is fragmented (at least ``min_descriptors`` descriptors whose mean is below
    ``below_bytes``, where one copy each falls short of the PCIe rate) and its host side comes
    in runs whose mean is at least ``min_span_bytes`` (whole runs cross PCIe at its rate).
    Coalesced batches of large descriptors keep their one copy per descriptor.
    """
    if mode == "never" or descriptors == 0:
        return False
    if mode == "always":
        return True
    fragmented = descriptors >= min_descriptors and nbytes < descriptors * below_bytes
    return fragmented and nbytes >= spans * min_span_bytes


@dataclass(frozen=True, slots=True)
class StagingPlan:
    """One batch through the ring.

    Staging bytes are the descriptors in the order given, end to end, cut into fills of
    ``capacity`` bytes (a whole number of ``unit``-byte rows). ``rows[i]`` is the device row of
    staging row ``i``; ``pieces`` holds one ``(offset in the fill's buffer, host offset,
    length)`` per host copy, and ``fills[j]:fills[j + 1]`` are fill ``j``'s pieces.
    """

    unit: int
    capacity: int
    rows: Int64Array
    pieces: Int64Array
    fills: Int64Array
    #: Maximal host runs (before fills cut them): what :func:`stage` decides from.
    spans: int

    @property
    def nbytes(self) -> int:
        return len(self.rows) * self.unit

    @property
    def buffers(self) -> int:
        """How many fills of the ring the batch takes."""
        return len(self.fills) - 1

    def fill_rows(self, j: int) -> tuple[int, int]:
        """Staging rows ``[lo, hi)`` of fill ``j``."""
        per = self.capacity // self.unit
        return j * per, min((j + 1) * per, len(self.rows))


#: Host runs up to which :func:`fill_pieces` cuts them in a loop: some thirty numpy calls cost
#: more than a loop over a few runs (a write into free slots is one run per chunk).
_FEW_SPANS = 8


def fill_pieces(
    span_host: Int64Array, span_linear: Int64Array, span_bytes: Int64Array, capacity: int
) -> tuple[Int64Array, Int64Array]:
    """Host runs (at host offsets ``span_host``, at staging offsets ``span_linear``, laid end
    to end from staging offset 0 as every plan lays them, of ``span_bytes``) cut where fills of
    ``capacity`` bytes end: ``(pieces, fills)`` as :class:`StagingPlan` holds them."""
    if len(span_host) <= _FEW_SPANS:
        return _few_pieces(span_host.tolist(), span_linear.tolist(), span_bytes.tolist(), capacity)
    size = int(span_bytes[0])  # runs of one size end to end from 0 never cross a fill's end
    if capacity % size == 0 and not np.any(span_bytes != size):
        return _whole_pieces(span_host, size, capacity)
    first_fill = span_linear // capacity
    last_fill = (span_linear + span_bytes - 1) // capacity
    cuts = last_fill - first_fill + 1
    fill = np.repeat(first_fill, cuts) + (
        np.arange(int(cuts.sum()), dtype=np.int64) - np.repeat(np.cumsum(cuts) - cuts, cuts)
    )
    lo = np.maximum(np.repeat(span_linear, cuts), fill * capacity)
    hi = np.minimum(np.repeat(span_linear + span_bytes, cuts), (fill + 1) * capacity)
    pieces = np.stack(
        (lo - fill * capacity, np.repeat(span_host - span_linear, cuts) + lo, hi - lo), axis=1
    ).astype(np.int64)
    buffers = int(fill[-1]) + 1
    fills = np.searchsorted(fill, np.arange(buffers + 1), side="left").astype(np.int64)
    return pieces, fills


def _whole_pieces(span_host: Int64Array, size: int, capacity: int) -> tuple[Int64Array, Int64Array]:
    """:func:`fill_pieces` of runs of one ``size`` that divides ``capacity``, end to end from
    staging offset 0 (whole scattered pages of a whole-slot tier): no run crosses a fill's end,
    so each is one piece, ``capacity // size`` a fill (a few array operations, where the
    general cut takes some thirty before a batch's first copy)."""
    n, per = len(span_host), capacity // size
    pieces = np.empty((n, 3), dtype=np.int64)
    pieces[:, 0] = np.arange(n, dtype=np.int64) % per * size
    pieces[:, 1] = span_host
    pieces[:, 2] = size
    fills = np.arange(0, n + per, per, dtype=np.int64)
    fills[-1] = n
    return pieces, fills


def _few_pieces(
    hosts: list[int], linears: list[int], sizes: list[int], capacity: int
) -> tuple[Int64Array, Int64Array]:
    """:func:`fill_pieces` of a few runs, one piece at a time."""
    pieces: list[tuple[int, int, int]] = []
    fills: list[int] = []  # each fill's first piece, then the end
    for host, linear, size in zip(hosts, linears, sizes, strict=True):
        lo, end = linear, linear + size
        while lo < end:
            fill, offset = divmod(lo, capacity)
            while len(fills) <= fill:
                fills.append(len(pieces))
            hi = min(end, (fill + 1) * capacity)
            pieces.append((offset, host + lo - linear, hi - lo))
            lo = hi
    fills.append(len(pieces))
    return np.array(pieces, dtype=np.int64).reshape(-1, 3), np.array(fills, dtype=np.int64)


def page_pieces(
    starts: Int64Array, page_bytes: int, capacity: int
) -> tuple[Int64Array, Int64Array]:
    """The fills of whole pages at host offsets ``starts``, in that order (consecutive slots
    joined): what :func:`plan_staging` plans for those pages' descriptors from a whole-slot
    tier, whose fills hold ``capacity`` bytes (``buffer_bytes // unit * unit``, the unit of
    :func:`row_unit` of one fragment)."""
    joined = starts[1:] == starts[:-1] + page_bytes
    first = np.flatnonzero(np.concatenate(([True], ~joined)))
    stops = np.concatenate((first[1:], [len(starts)]))
    return fill_pieces(starts[first], first * page_bytes, (stops - first) * page_bytes, capacity)


def row_unit(gcd: int, buffer_bytes: int) -> int:
    """The row size of a plan whose device offsets and lengths have ``gcd`` in common: cut to
    divide ``buffer_bytes`` when larger, halved while above :data:`MAX_ROW_BYTES`."""
    unit = gcd if gcd <= buffer_bytes else int(np.gcd(gcd, buffer_bytes))
    while unit > MAX_ROW_BYTES and unit % 2 == 0:
        unit //= 2
    return unit


def plan_staging(
    host: Int64Array,
    device: Int64Array,
    length: Int64Array,
    *,
    buffer_bytes: int,
    write: str,
    checked: bool = False,
) -> StagingPlan | None:
    """The plan for descriptors between host offsets ``host`` and device offsets ``device``,
    staged in the order given; None when they move nothing, or when ``write`` (``"device"``
    for restores, ``"host"`` for stores) ranges overlap: several writes to one byte keep their
    order only one copy at a time, so such a batch takes another path. ``checked``: the caller
    has made sure of that already (:func:`.cuda_chunks.overlapping`), so the plan skips it.

    The row size is the gcd of every device offset and length (halved while above
    :data:`MAX_ROW_BYTES`, and cut to divide ``buffer_bytes`` when larger than it), so every
    descriptor is whole rows on the device side and every fill ends on a row boundary.
    """
    if len(length) == 0:
        return None
    h, g, n = host, device, length
    size = int(n[0])
    # One length that divides every device offset (a pool's fragments): that is the gcd.
    uniform = size > 0 and not np.any(n != size) and not any_remainder(g, size)
    if uniform:
        return _plan_uniform(h, g, size, buffer_bytes=buffer_bytes, write=write, checked=checked)
    if int(n.sum()) == 0:
        return None
    if write == "host" and not checked and overlapping(h, n):
        return None
    unit = row_unit(int(np.gcd(np.gcd.reduce(g), np.gcd.reduce(n))), buffer_bytes)
    capacity = buffer_bytes // unit * unit
    linear = packed(n)  # staging bytes: the descriptors end to end, as every staged path
    counts = n // unit
    total = int(counts.sum())
    first = np.repeat(np.cumsum(counts) - counts, counts)
    rows = np.repeat(g // unit, counts) + (np.arange(total, dtype=np.int64) - first)
    # Device ranges overlap where two staging rows share a device row.
    if write == "device" and not checked and repeats(rows):
        return None
    # Host runs: consecutive descriptors that continue each other.
    joined = h[1:] == h[:-1] + n[:-1]
    starts = np.flatnonzero(np.concatenate(([True], ~joined)))
    stops = np.concatenate((starts[1:], [len(n)]))
    span_linear = linear[starts]
    span_bytes = linear[stops - 1] + n[stops - 1] - span_linear
    pieces, fills = fill_pieces(h[starts], span_linear, span_bytes, capacity)
    return StagingPlan(unit, capacity, rows, pieces, fills, len(starts))


def _plan_uniform(
    h: Int64Array, g: Int64Array, size: int, *, buffer_bytes: int, write: str, checked: bool
) -> StagingPlan | None:
    """:func:`plan_staging` of descriptors of one length ``size`` (> 0) that divides every
    device offset, the shape of every batch of a pool's fragments: each staging offset is a
    multiple of ``size``, so the host runs and their staging offsets come from one pass of
    host steps, not from prefix sums (a plan runs before each batch's first copy)."""
    step = h[1:] - h[:-1]  # host order: ascending by at least ``size`` means no overlap
    if (
        write == "host"
        and not checked
        and int(step.min(initial=size)) < size
        and overlapping(h, np.full(len(h), size, dtype=np.int64))
    ):
        return None
    unit = row_unit(size, buffer_bytes)
    capacity = buffer_bytes // unit * unit
    if unit == size:  # one row per descriptor
        rows = g // unit
    else:  # ``size`` rows of ``unit`` per descriptor, consecutive on the device
        per = size // unit
        rows = ((g // unit)[:, None] + np.arange(per, dtype=np.int64)).reshape(-1)
    # Device ranges overlap where two staging rows share a device row.
    if write == "device" and not checked and repeats(rows):
        return None
    # Host runs: consecutive descriptors that continue each other.
    starts = np.flatnonzero(step != size)
    starts += 1
    starts = np.concatenate(([0], starts))
    stops = np.concatenate((starts[1:], [len(h)]))
    span_linear = starts * size
    pieces, fills = fill_pieces(h[starts], span_linear, (stops - starts) * size, capacity)
    return StagingPlan(unit, capacity, rows, pieces, fills, len(starts))
