"""Scattered tier slots through a bounded ring of device staging buffers: the cuda transport's
staging path.

A tier slot is contiguous on the host, but a ``layer_first`` pool cuts each page into one
fragment per layer and K/V (128 KiB for ``qwen3-32b``), so a restore from scattered slots is
thousands of small copies, and one copy call per fragment reaches a sixth of the PCIe rate.
Here each contiguous host run (a slot, or consecutive slots) crosses PCIe whole, as one copy
into a ring buffer on the transport's stream; a second stream then scatters the buffer into the
pool's layout with one index kernel at HBM speed, while the next buffer is copied. Stores run
the other way: an index kernel gathers the pages into a buffer, then whole host runs leave it.
The ring holds ``buffers`` buffers of ``buffer_bytes`` each, allocated once per GPU when a
tier registers: all the GPU memory the path takes, besides one int64 per row of indices per
batch.

A batch is planned in growing chunks (:mod:`.cuda_chunks`), so its first copies start
before the rest is planned.

Planning (:func:`plan_staging`) and the choice (:func:`stage`) are numpy and plain numbers,
tested without a GPU; :class:`StagingRing` needs torch with CUDA.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ...staging import packed
from .cuda_chunks import any_remainder, repeats

__all__ = ["StagingPlan", "StagingRing", "host_spans", "plan_staging", "stage"]

Int64Array = npt.NDArray[np.int64]

# Widest row elements first: fewer index computations per byte in the kernels.
_ITEMSIZES = (8, 4, 2, 1)
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

    Staging bytes are the descriptors in host order, end to end, cut into fills of
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


def plan_staging(
    host: Int64Array,
    device: Int64Array,
    length: Int64Array,
    *,
    buffer_bytes: int,
    write: str,
    checked: bool = False,
) -> StagingPlan | None:
    """The plan for descriptors between host offsets ``host`` and device offsets ``device``;
    None when they move nothing, or when ``write`` (``"device"`` for restores, ``"host"`` for
    stores) ranges overlap: several writes to one byte keep their order only one copy at a
    time, so such a batch takes another path. ``checked``: the caller has made sure of that
    already (:func:`.cuda_chunks.overlapping`), so the plan skips it.

    The row size is the gcd of every device offset and length (halved while above
    :data:`MAX_ROW_BYTES`, and cut to divide ``buffer_bytes`` when larger than it), so every
    descriptor is whole rows on the device side and every fill ends on a row boundary.
    """
    if len(length) == 0 or int(length.sum()) == 0:
        return None
    if np.all(host[1:] >= host[:-1]):  # already in host order (slots laid out in order)
        h, g, n = host, device, length
    else:
        order = np.argsort(host, kind="stable")
        h, g, n = host[order], device[order], length[order]
    joined = h[1:] == h[:-1] + n[:-1]
    if write == "host" and not checked and np.any(h[1:] < h[:-1] + n[:-1]):
        return None  # sorted by start, an overlap shows between neighbours
    size = int(n[0])
    # One length that divides every device offset (a pool's fragments): that is the gcd.
    uniform = size > 0 and not np.any(n != size) and not any_remainder(g, size)
    unit = size if uniform else int(np.gcd(np.gcd.reduce(g), np.gcd.reduce(n)))
    if unit > buffer_bytes:
        unit = int(np.gcd(unit, buffer_bytes))
    while unit > MAX_ROW_BYTES and unit % 2 == 0:
        unit //= 2
    capacity = buffer_bytes // unit * unit
    linear = packed(n)  # staging bytes: the descriptors end to end, as every staged path
    if uniform and unit == size:  # one row per descriptor
        rows = g // unit
    else:
        counts = n // unit
        total = int(counts.sum())
        first = np.repeat(np.cumsum(counts) - counts, counts)
        rows = np.repeat(g // unit, counts) + (np.arange(total, dtype=np.int64) - first)
    # Device ranges overlap where two staging rows share a device row.
    if write == "device" and not checked and repeats(rows):
        return None
    # Host runs: consecutive descriptors (in host order) that continue each other.
    starts = np.flatnonzero(np.concatenate(([True], ~joined)))
    stops = np.concatenate((starts[1:], [len(n)]))
    span_host, span_linear = h[starts], linear[starts]
    span_bytes = linear[stops - 1] + n[stops - 1] - span_linear
    # Cut every run where a fill ends.
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
    return StagingPlan(unit, capacity, rows, pieces, fills, len(starts))


def _itemsize(unit: int, address: int) -> int:
    return next(size for size in _ITEMSIZES if unit % size == 0 and address % size == 0)


def _rows(torch: Any, flat: Any, unit: int, itemsize: int) -> Any:
    """``flat`` (uint8, 1-D) as ``(rows, unit / itemsize)`` elements of ``itemsize`` bytes."""
    dtype = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[itemsize]
    whole = flat.numel() // unit * unit
    return flat[:whole].view(dtype).view(-1, unit // itemsize)


@dataclass
class StagingRing:
    """``count`` device buffers of ``buffer_bytes`` on one GPU, and the events that order
    their reuse across batches (a buffer is refilled only once its last use completed)."""

    torch: Any = field(repr=False)
    device: int
    buffer_bytes: int
    count: int
    buffers: list[Any] = field(default_factory=list, repr=False)
    filled: list[Any] = field(default_factory=list, repr=False)
    free: list[Any] = field(default_factory=list, repr=False)
    next: int = 0
    fills: int = 0
    #: Fills read ahead of their batch (:meth:`read_ahead`): the ticket that may adopt them,
    #: then ``(slot, host offset, bytes)`` in the order their batch will fill.
    ahead: tuple[object, list[tuple[int, int, int]]] | None = field(default=None, repr=False)
    #: Fills adopted from a read-ahead so far.
    adopted: int = 0

    def __post_init__(self) -> None:
        torch = self.torch
        for _ in range(self.count):
            self.buffers.append(
                torch.empty(self.buffer_bytes, dtype=torch.uint8, device=f"cuda:{self.device}")
            )
            self.filled.append(torch.cuda.Event())
            self.free.append(torch.cuda.Event())

    @property
    def nbytes(self) -> int:
        return self.count * self.buffer_bytes

    def warm(self, aux: Any) -> float:
        """Move a few bytes through the ring each way, once per row element size, and wait;
        returns the seconds taken.

        CUDA loads a kernel's code when it is first launched, and the pinned allocator takes
        its first index buffer on first use: without this, a tier's first restore after it
        registers pays for both, tens of milliseconds on an H200 (a 1.9 GB restore took 61 ms
        where later ones took 39). ``aux`` is the ring's scatter stream.
        """
        torch = self.torch
        start = time.perf_counter()
        with torch.cuda.device(self.device):
            main = torch.cuda.current_stream()
            host = torch.zeros(8, dtype=torch.uint8, pin_memory=True)
            pool = torch.zeros(8, dtype=torch.uint8, device=f"cuda:{self.device}")
            origin = np.zeros(1, dtype=np.int64)
            keep: list[Any] = [host, pool]
            for size in _ITEMSIZES:  # each element size has its own kernels
                length = np.full(1, size, dtype=np.int64)
                plan = plan_staging(
                    origin, origin, length, buffer_bytes=self.buffer_bytes, write="device"
                )
                assert plan is not None  # one descriptor of `size` bytes
                keep += self.restore(plan, host, pool, main, aux)
                aux.wait_stream(main)
                keep += self.store(plan, pool, host, main, aux)
            main.synchronize()
            aux.synchronize()
        self.next = self.fills = 0
        return time.perf_counter() - start

    def _take(self) -> int:
        slot = self.next
        self.next = (slot + 1) % self.count
        self.fills += 1
        if self.ahead is not None and any(slot == held for held, _, _ in self.ahead[1]):
            self.ahead = None  # a fill read ahead is about to be overwritten: none is adopted
        return slot

    def read_ahead(self, ticket: object, host: Any, start: int, fills: int, main: Any) -> None:
        """Copy ``fills`` buffers' worth of host bytes from ``start`` into the next buffers on
        ``main`` (the current stream), before the batch that moves them is planned; that
        batch's restore adopts them (:meth:`restore` with ``ticket``) where its fills are
        exactly these bytes, and fills the rest itself. Only the latest read-ahead is kept;
        any other use of one of its buffers discards it.

        The caller holds the host bytes unchanged until it forgets ``ticket`` (a read's
        claim), so an adopted buffer holds what a fill made then would.
        """
        self.ahead = None
        held = []
        for j in range(fills):
            slot = self._take()
            at = start + j * self.buffer_bytes
            main.wait_event(self.free[slot])
            self.buffers[slot].copy_(host[at : at + self.buffer_bytes], non_blocking=True)
            held.append((slot, at, self.buffer_bytes))
        self.ahead = (ticket, held)

    def held(self, ticket: object) -> int:
        """How many fills read ahead for ``ticket`` wait to be adopted."""
        return len(self.ahead[1]) if self.ahead is not None and self.ahead[0] is ticket else 0

    def forget(self, ticket: object) -> None:
        """Discard what was read ahead for ``ticket`` (its holder no longer holds the bytes)."""
        if self.ahead is not None and self.ahead[0] is ticket:
            self.ahead = None

    def _adopt(self, ticket: object, plan: StagingPlan, j: int) -> int | None:
        """The buffer read ahead for ``ticket`` that holds exactly fill ``j`` of ``plan``
        (taken from :attr:`ahead`), or None (and nothing is adopted after a miss)."""
        if self.ahead is None or self.ahead[0] is not ticket:
            return None
        slot, at, nbytes = self.ahead[1][0]
        pieces = plan.pieces[plan.fills[j] : plan.fills[j + 1]]
        whole = len(pieces) == 1 and nbytes == plan.capacity
        if not (whole and pieces[0].tolist() == [0, at, nbytes]):
            self.ahead = None
            return None
        rest = self.ahead[1][1:]
        self.ahead = (ticket, rest) if rest else None
        self.adopted += 1
        return slot

    def _index(self, plan: StagingPlan, stream: Any) -> tuple[Any, Any]:
        """The plan's row indices, uploaded on ``stream`` from pinned memory."""
        torch = self.torch
        host = torch.from_numpy(plan.rows).pin_memory()
        with torch.cuda.stream(stream):
            return host, host.to(f"cuda:{self.device}", non_blocking=True)

    def _views(self, plan: StagingPlan, pool: Any) -> tuple[Any, list[Any]]:
        """The pool and every ring buffer as rows of ``plan.unit`` bytes."""
        torch = self.torch
        itemsize = _itemsize(plan.unit, pool.data_ptr())
        views = [_rows(torch, b[: plan.capacity], plan.unit, itemsize) for b in self.buffers]
        return _rows(torch, pool, plan.unit, itemsize), views

    def restore(
        self, plan: StagingPlan, host: Any, pool: Any, main: Any, aux: Any, ticket: object = None
    ) -> list[Any]:
        """Enqueue host -> pool: whole runs into the ring on ``main``, scatter on ``aux``.

        ``host`` is a pinned uint8 CPU tensor, ``pool`` a uint8 CUDA tensor (the batch's
        endpoints); ``main`` must be the current stream. No stream waits for the other as a
        whole: each scatter waits for its buffer's fill (recorded on ``main`` after everything
        enqueued there before it, the index upload included: it follows the first fill's
        copies, so PCIe starts before the indices are ready), each fill for its buffer's last
        scatter. The work is complete once ``aux`` passes this point; returns what must stay
        alive until then.
        """
        torch = self.torch
        pieces = plan.pieces.tolist()
        fills = plan.fills.tolist()
        for j in range(plan.buffers):
            adopted = None if ticket is None else self._adopt(ticket, plan, j)
            if adopted is not None:  # read ahead on main: its copies precede what follows
                slot = adopted
            else:
                slot = self._take()
                buffer = self.buffers[slot]
                main.wait_event(self.free[slot])
                for offset, at, n in pieces[fills[j] : fills[j + 1]]:  # main is current
                    buffer[offset : offset + n].copy_(host[at : at + n], non_blocking=True)
            if j == 0:  # PCIe starts before the indices are made and uploaded
                index_host, index = self._index(plan, main)
                pool_rows, views = self._views(plan, pool)
            self.filled[slot].record(main)
            aux.wait_event(self.filled[slot])
            lo, hi = plan.fill_rows(j)
            with torch.cuda.stream(aux):
                pool_rows.index_copy_(0, index[lo:hi], views[slot][: hi - lo])
            self.free[slot].record(aux)
        return [index_host, index]

    def store(self, plan: StagingPlan, pool: Any, host: Any, main: Any, aux: Any) -> list[Any]:
        """Enqueue pool -> host: gather into the ring on ``aux``, whole runs out on ``main``.

        ``aux`` must already wait for what ``main`` holds before the batch (the caller's
        ``aux.wait_stream(main)``, once per batch); complete once ``main`` passes this point.
        """
        torch = self.torch
        index_host, index = self._index(plan, aux)
        pool_rows, views = self._views(plan, pool)
        pieces = plan.pieces.tolist()
        fills = plan.fills.tolist()
        for j in range(plan.buffers):
            slot = self._take()
            buffer = self.buffers[slot]
            aux.wait_event(self.free[slot])
            lo, hi = plan.fill_rows(j)
            with torch.cuda.stream(aux):
                torch.index_select(pool_rows, 0, index[lo:hi], out=views[slot][: hi - lo])
            self.filled[slot].record(aux)
            main.wait_event(self.filled[slot])
            for offset, at, n in pieces[fills[j] : fills[j + 1]]:  # main is current
                host[at : at + n].copy_(buffer[offset : offset + n], non_blocking=True)
            self.free[slot].record(main)
        return [index_host, index]
