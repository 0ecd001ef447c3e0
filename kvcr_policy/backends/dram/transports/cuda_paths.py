"""How the cuda transport moves one batch on its stream: copies, gather kernels or the staging ring.

- ``copies``: one asynchronous copy per descriptor (a copy engine at the PCIe rate once
  descriptors are large, i.e. coalesced), or every descriptor in one batch call where
  ``copy_calls`` is ``batched`` (:mod:`.cuda_batch`), which keeps pieces of a few hundred KiB
  at the PCIe rate too;
- ``gather``: many small descriptors become a few index kernels that read or write the pinned
  tier through its device mapping (:mod:`.cuda_gather`);
- ``staging``: many small descriptors whose host side comes in long contiguous runs cross PCIe
  run by run into a bounded ring of device buffers, scattered on a second stream
  (:mod:`.cuda_staging`). A batch is planned in growing chunks, its first copies
  enqueued before the rest is planned (:mod:`.cuda_chunks`); a staged restore
  completes on the scatter stream, and a later batch on another path waits for it first.

:class:`CopyPaths` owns the rings and scatter streams of every device; the transport owns the
main streams, the endpoints' views and completion.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from .cuda_batch import BatchCopier, load_batch
from .cuda_chunks import chunk_bounds, host_runs, overlapping
from .cuda_gather import choose_kernel, plan_rows, run_rows
from .cuda_options import CudaOptions
from .cuda_plan import host_spans, page_pieces, plan_staging, row_unit, stage
from .cuda_staging import StagingRing

__all__ = ["CopyPaths", "copies"]


class CopyPaths:
    """The per-batch choice of path and its enqueueing, for one transport.

    ``count(name, n)`` adds ``n`` to the transport's counter ``name`` (staged chunks here).
    ``calls`` is ``batched`` or ``each`` (:func:`.cuda_options.resolved_calls`).
    """

    def __init__(
        self,
        torch: Any,
        options: CudaOptions,
        gather: str,
        staging: str,
        count: Callable[[str, int], None],
        calls: str = "each",
    ) -> None:
        self._torch = torch
        self.options = options
        self.gather = gather
        self.staging = staging
        self._count = count
        #: The batch call, when ``calls`` is ``batched`` and the runtime has it.
        self.batch: BatchCopier | None = load_batch(torch) if calls == "batched" else None
        self.rings: dict[int, StagingRing] = {}
        self.aux: dict[int, Any] = {}
        self.warmed: dict[int, float] = {}  # seconds each ring's warm-up took
        self._aux_behind: set[int] = set()  # devices whose aux stream holds unwaited scatters
        # Devices whose main stream holds writes to a pool or a ring buffer that no store's
        # gathers waited for: only those, not a store's copies out, hold the next store back.
        self._main_wrote: set[int] = set()

    def path(self, d: Any) -> str:
        """``copies`` or ``gather`` for ``d`` (before staging is considered)."""
        mode = self.gather
        if mode == "never" or len(d) == 0:
            return "copies"
        if mode == "always":
            return "gather"
        small = d.nbytes < len(d) * int(self.options.gather_below_bytes)
        return "gather" if small and len(d) >= self.options.gather_min_descriptors else "copies"

    def ring(self, device: int) -> tuple[StagingRing, Any]:
        """The staging ring of ``device`` and its scatter stream, made (and warmed:
        :meth:`.StagingRing.warm`) on first need."""
        ring = self.rings.get(device)
        if ring is None:
            options = self.options
            ring = StagingRing(
                self._torch, device, int(options.staging_buffer_bytes), options.staging_buffers,
                batch=self.batch,
            )  # fmt: skip
            aux = self._torch.cuda.Stream(device=device)
            self.warmed[device] = ring.warm(aux)
            self.rings[device], self.aux[device] = ring, aux
        return ring, self.aux[device]

    def direct(
        self, d: Any, src: dict[str, Any], dst: dict[str, Any], device: int, stream: Any, path: str,
        restore: bool = True,
    ) -> tuple[str, list[Any]]:  # fmt: skip
        """Copies (or gather kernels) on ``stream``, after a staged restore's scatters;
        ``restore``: they write the pool."""
        torch = self._torch
        if device in self._aux_behind:
            stream.wait_stream(self.aux[device])
            self._aux_behind.discard(device)
        if restore:
            self._main_wrote.add(device)
        keep: list[Any] = []
        if path == "gather":
            chunk = int(self.options.gather_chunk_bytes)
            plan = plan_rows(d, src_base=src["mapped"].data_ptr(),
                             dst_base=dst["mapped"].data_ptr(), max_unit=chunk)  # fmt: skip
            if plan is not None:
                kind = choose_kernel(plan)
                keep = run_rows(torch, src["mapped"], dst["mapped"], plan, kind,
                                device=torch.device("cuda", device), chunk_bytes=chunk)  # fmt: skip
                return f"gather:{kind}", keep
            return path, keep
        # A batch call runs its pieces in no set order: one that writes a byte twice goes
        # one copy at a time, in order.
        batched = self.batch is not None and stream.cuda_stream and len(d) > 1
        if batched and not overlapping(d.dst, d.length):
            base_src, base_dst = src["copy"].data_ptr(), dst["copy"].data_ptr()
            assert self.batch is not None
            self.batch.copy_calls(
                (d.dst + base_dst).astype(np.uint64), (d.src + base_src).astype(np.uint64),
                d.length.astype(np.uint64), stream.cuda_stream,
            )  # fmt: skip
            self._count("copies.batched", 1)
            return path, keep
        copies(src["copy"], dst["copy"], d)
        return path, keep

    def staged(
        self,
        d: Any,
        src: dict[str, Any],
        dst: dict[str, Any],
        src_device: int | None,
        dst_device: int | None,
        device: int,
        stream: Any,
        ticket: object = None,
    ) -> tuple[str, list[Any], Any] | None:
        """Move ``d`` through the staging ring when the policy says so: its path, what to keep
        alive, and the stream that finishes it; None otherwise. A restore adopts the fills read
        ahead for ``ticket`` (:meth:`read_ahead`) that hold exactly its first fills.

        A batch is planned in growing chunks, each enqueued before the next is planned
        (:func:`.cuda_chunks.chunk_bounds`): from two ring buffers' worth when it finds
        ``stream`` idle, from the ring's worth when copies are ahead of it.
        """
        if self.staging == "never" or (src_device is None) == (dst_device is None):
            return None  # off, or not between a GPU and the host
        restore = src_device is None
        options = self.options
        ring = self.rings.get(device)
        if restore and ring is not None and ring.held_bytes(ticket):
            # Its first fills are copying already: staged whatever its shape, so it adopts
            # them (pieces of whole slots cross PCIe as fast from the ring as straight).
            return self._stage(d, src, dst, device, stream, ticket, restore, False)
        choose = partial(
            stage,
            self.staging,
            descriptors=len(d),
            nbytes=d.nbytes,
            below_bytes=int(options.gather_below_bytes),
            min_descriptors=options.gather_min_descriptors,
            min_span_bytes=int(options.staging_min_span_bytes),
        )
        if not choose(spans=0):  # not fragmented: no need to plan
            return None
        host, pool = (d.src, d.dst) if restore else (d.dst, d.src)
        sorted_ = False
        if not choose(spans=host_runs(host, d.length)):
            # Runs in the order given fall short: host order may join them (one sort).
            if not choose(spans=host_spans(host, d.length)[0]):
                return None
            if overlapping(pool if restore else host, d.length):
                return None  # reordered writes to one byte would change the result
            d = d.take(np.argsort(host, kind="stable"))
            sorted_ = True
        return self._stage(d, src, dst, device, stream, ticket, restore, sorted_)

    def _stage(
        self, d: Any, src: dict[str, Any], dst: dict[str, Any], device: int, stream: Any,
        ticket: object, restore: bool, sorted_: bool,
    ) -> tuple[str, list[Any], Any]:  # fmt: skip
        """Plan ``d`` in chunks and enqueue it through the ring (see :meth:`staged`)."""
        options = self.options
        host, pool = (d.src, d.dst) if restore else (d.dst, d.src)
        buffer_bytes = int(options.staging_buffer_bytes)
        ring, aux = self.ring(device)
        # Idle: copying starts once two ring buffers' worth is planned. Busy: the batch is
        # still planned in chunks (the ring's worth first), so its first copies are enqueued
        # well before the copies ahead of it end, however long the whole batch takes to plan.
        first = buffer_bytes * (2 if stream.query() else ring.count)
        then = None
        held = ring.held_bytes(ticket) if restore else 0
        if held:
            # Fills read ahead for this read are copying: the first chunk is exactly them, the
            # next one buffer, so new copies are enqueued soon after the read-ahead's.
            first, then = held, buffer_bytes
        write = "device" if restore else "host"
        keep: list[Any] = []
        if not restore and device in self._main_wrote:
            aux.wait_stream(stream)  # gathers read the pool after what was written on stream
            self._main_wrote.discard(device)
        chunks = 0
        # Chunks run in the order given, each after the one before (scatters in order on aux,
        # host writes in order on stream), so only writes within a chunk need checking.
        for lo, hi in chunk_bounds(d.length, first, then):
            plan = plan_staging(
                host[lo:hi],
                pool[lo:hi],
                d.length[lo:hi],
                buffer_bytes=buffer_bytes,
                write=write,
                checked=sorted_,
            )
            if plan is None:  # moves nothing, or writes one byte twice: copies, in order
                self.direct(d.take(np.arange(lo, hi)), src, dst, device, stream, "copies",
                            restore)  # fmt: skip
                if not restore:
                    aux.wait_stream(stream)
                continue
            chunks += 1
            if restore:
                adopted = ring.adopted
                keep += ring.restore(plan, src["copy"], dst["copy"], stream, aux, ticket)
                if ring.adopted != adopted:
                    self._count("staging:read_ahead.adopted", ring.adopted - adopted)
                self._aux_behind.add(device)
            else:
                keep += ring.store(plan, src["copy"], dst["copy"], stream, aux)
        self._count(f"staging:{'restore' if restore else 'store'}.chunks", chunks)
        if not chunks:  # every chunk took copies
            return "copies", keep, stream
        if restore:  # the scatters on aux finish it; later batches on stream wait for them
            return "staging:restore", keep, aux if device in self._aux_behind else stream
        self._aux_behind.discard(device)  # stream waited for every gather
        return "staging:store", keep, stream

    def read_ahead(
        self, ticket: object, host: Any, starts: Any, page_bytes: int, fragments: int,
        device: int, stream: Any,
    ) -> int:  # fmt: skip
        """Start filling the ring of ``device`` on ``stream`` (named, not entered: every copy
        and event of a read-ahead names its stream) from the tier slots at
        host offsets ``starts`` (the pages a read claimed, in order: its first batch), before
        their batch is planned; returns the fills started.

        The fills are those the batch's plan will make (:func:`.cuda_plan.page_pieces`: its
        pages in order, consecutive slots or scattered), at most the ring's worth; the batch
        that carries ``ticket`` is staged to adopt them, whatever its shape (:meth:`staged`)."""
        options = self.options
        buffer_bytes = int(options.staging_buffer_bytes)
        if self.staging == "never" or len(starts) == 0 or page_bytes % fragments:
            return 0
        unit = row_unit(page_bytes // fragments, buffer_bytes)
        capacity = buffer_bytes // unit * unit
        ring, _ = self.ring(device)
        head = starts[: -(-ring.count * capacity // page_bytes)]  # the pages the ring holds
        pieces, fills = page_pieces(head, page_bytes, capacity)
        started = ring.read_ahead(ticket, host, pieces, fills, capacity, stream)
        self._main_wrote.add(device)  # ring buffers a store may take before the read adopts
        self._count("staging:read_ahead.fills", started)
        return started

    def forget(self, ticket: object) -> None:
        """Discard what was read ahead for ``ticket`` on every ring."""
        for ring in self.rings.values():
            ring.forget(ticket)

    def close(self) -> None:
        """Wait for every scatter stream; the staging buffers go back to the
        allocator."""
        for stream in self.aux.values():
            stream.synchronize()
        self.rings.clear()


def copies(src: Any, dst: Any, d: Any) -> None:
    """One asynchronous copy per descriptor on the current stream (pinned: truly async)."""
    for s, t, n in zip(d.src.tolist(), d.dst.tolist(), d.length.tolist(), strict=True):
        dst[t : t + n].copy_(src[s : s + n], non_blocking=True)
