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
tier registers, with the pinned and device buffers its plans' row indices go up through
(:mod:`.cuda_index`, a few MiB, grown only for a chunk of more rows): all the GPU memory the
path takes. No staged chunk allocates memory.

A batch is planned in growing chunks (:mod:`.cuda_chunks`), so its first copies start
before the rest is planned. A fill's pieces cross in ``cudaMemcpyBatchAsync`` calls where the
runtime has it (:mod:`.cuda_batch`, calls of at most 128 pieces), so pages of a few hundred
KiB cross at the PCIe rate instead of at the rate the CPU issues copies.

Fills take the descriptors in the order given, which for a whole-slot tier is page by page:
the ring's first fills then hold the read's first pages whether their slots are consecutive or
scattered, so a read's copies can start before its batch is planned
(:meth:`StagingRing.read_ahead`, :func:`.cuda_plan.page_pieces`).

The plan and the choice are :mod:`.cuda_plan` (numpy, tested without a GPU);
:class:`StagingRing` needs torch with CUDA.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .cuda_batch import BatchCopier
from .cuda_index import IndexBuffers
from .cuda_plan import StagingPlan, plan_staging

__all__ = ["StagingRing"]

Int64Array = npt.NDArray[np.int64]

# Widest row elements first: fewer index computations per byte in the kernels.
_ITEMSIZES = (8, 4, 2, 1)


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
    their reuse across batches (a buffer is refilled only once its last use completed).

    ``batch`` moves a fill's pieces in batch calls (None: one ``copy_`` each).
    """

    torch: Any = field(repr=False)
    device: int
    buffer_bytes: int
    count: int
    batch: BatchCopier | None = field(default=None, repr=False)
    buffers: list[Any] = field(default_factory=list, repr=False)
    filled: list[Any] = field(default_factory=list, repr=False)
    free: list[Any] = field(default_factory=list, repr=False)
    next: int = 0
    fills: int = 0
    #: Fills read ahead of their batch (:meth:`read_ahead`): the ticket that may adopt them,
    #: the bytes a fill holds, then ``(slot, pieces)`` in the order their batch will fill.
    ahead: tuple[object, int, list[tuple[int, Int64Array]]] | None = field(default=None, repr=False)
    #: Fills adopted from a read-ahead so far.
    adopted: int = 0
    _row_views: dict[tuple[int, int, int], list[Any]] = field(default_factory=dict, repr=False)
    #: The plans' row indices on the GPU (:mod:`.cuda_index`).
    index: IndexBuffers = field(init=False, repr=False)

    def __post_init__(self) -> None:
        torch = self.torch
        for _ in range(self.count):
            self.buffers.append(
                torch.empty(self.buffer_bytes, dtype=torch.uint8, device=f"cuda:{self.device}")
            )
            self.filled.append(torch.cuda.Event())
            self.free.append(torch.cuda.Event())
        self.index = IndexBuffers(torch, self.device, self.nbytes, batch=self.batch)

    @property
    def nbytes(self) -> int:
        return self.count * self.buffer_bytes

    def warm(self, aux: Any) -> float:
        """Move a few bytes through the ring each way, once per row element size, and wait;
        returns the seconds taken.

        CUDA loads a kernel's code when it is first launched: without this, a tier's first
        restore after it registers pays for it, tens of milliseconds on an H200 (a 1.9 GB
        restore took 61 ms where later ones took 39). ``aux`` is the ring's scatter stream.
        """
        torch = self.torch
        start = time.perf_counter()
        # A stream of its own: the legacy default stream takes no batch call.
        main = torch.cuda.Stream(device=self.device)
        with torch.cuda.device(self.device), torch.cuda.stream(main):
            host = torch.zeros(128, dtype=torch.uint8, pin_memory=True)
            pool = torch.zeros(64, dtype=torch.uint8, device=f"cuda:{self.device}")
            keep: list[Any] = [host, pool]
            for size in _ITEMSIZES:  # each element size has its own kernels
                origin = np.arange(8, dtype=np.int64) * size
                length = np.full(8, size, dtype=np.int64)
                plan = plan_staging(  # eight pieces, apart on the host: a batch call splits
                    2 * origin, origin, length, buffer_bytes=self.buffer_bytes, write="device"
                )
                assert plan is not None  # eight descriptors of `size` bytes
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
        if self.ahead is not None and any(slot == held for held, _ in self.ahead[2]):
            self.ahead = None  # a fill read ahead is about to be overwritten: none is adopted
        return slot

    def _move(self, slot: int, pieces: Int64Array, host: Any, main: Any, into: bool) -> None:
        """Copy ``pieces`` (``(offset in the buffer, host offset, length)`` rows) between ring
        buffer ``slot`` and pinned ``host`` on ``main``: into the buffer, or out."""
        buffer = self.buffers[slot]
        if self.batch is None or not main.cuda_stream:  # one copy_ each (no batch call on the
            # legacy default stream), on main whichever stream is current
            with self.torch.cuda.stream(main):
                for offset, at, n in pieces.tolist():
                    if into:
                        buffer[offset : offset + n].copy_(host[at : at + n], non_blocking=True)
                    else:
                        host[at : at + n].copy_(buffer[offset : offset + n], non_blocking=True)
            return
        ring = (pieces[:, 0] + buffer.data_ptr()).astype(np.uint64)
        tier = (pieces[:, 1] + host.data_ptr()).astype(np.uint64)
        sizes = pieces[:, 2].astype(np.uint64)
        dsts, srcs = (ring, tier) if into else (tier, ring)
        self.batch.copy_calls(dsts, srcs, sizes, main.cuda_stream)

    def read_ahead(
        self, ticket: object, host: Any, pieces: Int64Array, fills: Int64Array, capacity: int,
        main: Any,
    ) -> int:  # fmt: skip
        """Fill the next buffers on ``main`` (named, not entered) with the fills ``pieces``
        and ``fills`` describe (:func:`.cuda_plan.page_pieces`: a read's first pages, in
        order, ``capacity`` bytes a fill), at most the ring's worth, before the batch that
        moves them is planned; that batch's restore adopts them (:meth:`restore` with
        ``ticket``) where its fills are exactly these, and fills the rest itself. Only the
        latest read-ahead is kept; any other use of one of its buffers discards it. Returns
        the fills started.

        The caller holds the host bytes unchanged until it forgets ``ticket`` (a read's
        claim), so an adopted buffer holds what a fill made then would.
        """
        self.ahead = None
        held = []
        for j in range(min(self.count, len(fills) - 1)):
            slot = self._take()
            main.wait_event(self.free[slot])
            mine = pieces[fills[j] : fills[j + 1]]
            self._move(slot, mine, host, main, into=True)
            # Each fill's own event: its scatter waits for it alone, not for the read-ahead
            # fills copied after it.
            self.filled[slot].record(main)
            held.append((slot, mine))
        self.ahead = (ticket, capacity, held)
        return len(held)

    def held_bytes(self, ticket: object) -> int:
        """Bytes of the fills read ahead for ``ticket`` that wait to be adopted (0: none)."""
        if self.ahead is None or self.ahead[0] is not ticket:
            return 0
        return self.ahead[1] * len(self.ahead[2])

    def forget(self, ticket: object) -> None:
        """Discard what was read ahead for ``ticket`` (its holder no longer holds the bytes)."""
        if self.ahead is not None and self.ahead[0] is ticket:
            self.ahead = None

    def _adopt(self, ticket: object, plan: StagingPlan, j: int) -> int | None:
        """The buffer read ahead for ``ticket`` that holds exactly fill ``j`` of ``plan``
        (taken from :attr:`ahead`), or None (and nothing is adopted after a miss)."""
        if self.ahead is None or self.ahead[0] is not ticket:
            return None
        _, capacity, held = self.ahead
        slot, pieces = held[0]
        wanted = plan.pieces[plan.fills[j] : plan.fills[j + 1]]
        if plan.capacity != capacity or not np.array_equal(pieces, wanted):
            self.ahead = None
            return None
        self.ahead = (ticket, capacity, held[1:]) if len(held) > 1 else None
        self.adopted += 1
        return slot

    def _views(self, plan: StagingPlan, pool: Any) -> tuple[Any, list[Any]]:
        """The pool and every ring buffer as rows of ``plan.unit`` bytes (the buffers' views
        made once per row shape: a batch of small pages would pay for them every time)."""
        torch = self.torch
        itemsize = _itemsize(plan.unit, pool.data_ptr())
        shape = (plan.unit, itemsize, plan.capacity)
        views = self._row_views.get(shape)
        if views is None:
            views = [_rows(torch, b[: plan.capacity], plan.unit, itemsize) for b in self.buffers]
            self._row_views[shape] = views
        return _rows(torch, pool, plan.unit, itemsize), views

    def restore(
        self, plan: StagingPlan, host: Any, pool: Any, main: Any, aux: Any, ticket: object = None
    ) -> list[Any]:
        """Enqueue host -> pool: whole runs into the ring on ``main``, scatter on ``aux``.

        ``host`` is a pinned uint8 CPU tensor, ``pool`` a uint8 CUDA tensor (the batch's
        endpoints); every copy and wait names its stream. No stream waits for the other as a
        whole: each scatter waits for its buffer's fill alone (an adopted fill's event was
        recorded when it was read ahead), each fill for its buffer's last scatter. The row
        indices go up on ``aux`` after the first fill's copies are enqueued (PCIe starts
        before they are made), never behind copies on ``main``. The work is complete once
        ``aux`` passes this point; returns what must stay alive until then (nothing: the
        indices' buffers are the ring's).
        """
        torch = self.torch
        pair = None
        try:
            # Every stream is named but the scatters', which run on the current one: aux,
            # entered once per chunk, not per fill (a fill of small pages takes less time to
            # cross PCIe than entering a stream takes on a slow host).
            with torch.cuda.stream(aux):
                for j in range(plan.buffers):
                    adopted = None if ticket is None else self._adopt(ticket, plan, j)
                    if adopted is not None:  # read ahead on main, its event recorded then
                        slot = adopted
                    else:
                        slot = self._take()
                        main.wait_event(self.free[slot])
                        pieces = plan.pieces[plan.fills[j] : plan.fills[j + 1]]
                        self._move(slot, pieces, host, main, True)
                        self.filled[slot].record(main)
                    if pair is None:  # the first fill's copies are enqueued: now the indices
                        pair, index = self.index.upload(plan.rows, aux)
                        pool_rows, views = self._views(plan, pool)
                    aux.wait_event(self.filled[slot])
                    lo, hi = plan.fill_rows(j)
                    pool_rows.index_copy_(0, index[lo:hi], views[slot][: hi - lo])
                    self.free[slot].record(aux)
        finally:
            if pair is not None:
                self.index.release(pair, aux)
        return []

    def store(self, plan: StagingPlan, pool: Any, host: Any, main: Any, aux: Any) -> list[Any]:
        """Enqueue pool -> host: gather into the ring on ``aux``, whole runs out on ``main``.

        ``aux`` must already wait for what ``main`` holds before the batch (the caller's
        ``aux.wait_stream(main)``, once per batch); complete once ``main`` passes this point.
        """
        torch = self.torch
        pair, index = self.index.upload(plan.rows, aux)
        try:
            pool_rows, views = self._views(plan, pool)
            # Every stream is named but the gathers', which run on the current one: aux, entered
            # once per chunk, not per fill (entering a stream costs more than a kernel launch).
            with torch.cuda.stream(aux):
                for j in range(plan.buffers):
                    slot = self._take()
                    aux.wait_event(self.free[slot])
                    lo, hi = plan.fill_rows(j)
                    torch.index_select(pool_rows, 0, index[lo:hi], out=views[slot][: hi - lo])
                    self.filled[slot].record(aux)
                    main.wait_event(self.filled[slot])
                    pieces = plan.pieces[plan.fills[j] : plan.fills[j + 1]]
                    self._move(slot, pieces, host, main, False)
                    self.free[slot].record(main)
        finally:
            self.index.release(pair, aux)
        return []
