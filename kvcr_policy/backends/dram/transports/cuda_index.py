"""Row indices of the staging ring's plans on the GPU, from buffers allocated once.

Each staged chunk uploads one int64 row index per staging row (a plan's ``rows``) for its
scatter or gather kernels. Made per chunk, that is a pinned host tensor (``pin_memory``) and
a device tensor each time: the first chunk of every new size pays a ``cudaHostAlloc``, and
a store measured once (or the first restore of a read) pays it inside its copies.
:class:`IndexBuffers` keeps pinned host and device buffers instead, taken when the ring is
made: a chunk writes its rows into an idle pair and uploads them on the stream that runs its
kernels, and the pair is idle again once that stream passed the chunk's last kernel (an
event, queried, never waited for: a busy pair is skipped, and a new pair is made only when
every pair is busy or too small).

Where the runtime has the batch call (:mod:`.cuda_batch`), the upload is one call of it through
ctypes, on the kernels' stream, not a torch copy on that stream entered: on one H100 an upload
took 0.10 ms that way and 0.15 ms the other, one of them before a staged store's first copy.

Needs torch with CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from .cuda_batch import BatchCopier

__all__ = ["IndexBuffers", "IndexPair"]

Int64Array = npt.NDArray[np.int64]

#: Pairs made with the ring (two allocations, one pinned, one on the GPU): a window of four
#: batches, the first of a call planned in up to three chunks, in flight together.
INITIAL_PAIRS = 8
#: Rows of each initial pair: one per 4 KiB of the ring (a ring's worth of 4 KiB fragments).
ROW_BYTES_COVERED = 4096
#: No pair holds fewer rows than this.
MIN_ROWS = 1024


@dataclass
class IndexPair:
    """A pinned host buffer and a device buffer of ``capacity`` int64 each, and the event
    after their last use."""

    host: Any = field(repr=False)
    device: Any = field(repr=False)
    capacity: int
    done: Any = field(repr=False)
    #: Uploaded, its last use not yet recorded (:meth:`IndexBuffers.release`).
    taken: bool = False
    #: ``host`` as numpy, and the batch call's arguments (device, host, bytes), made once.
    rows: Int64Array = field(init=False, repr=False)
    call: tuple[npt.NDArray[np.uint64], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rows = self.host.numpy()
        addresses = (self.device.data_ptr(), self.host.data_ptr(), 0)
        self.call = tuple(np.array([a], dtype=np.uint64) for a in addresses)


class IndexBuffers:
    """Pinned host and device int64 buffers of one GPU for the ring's row indices."""

    def __init__(
        self, torch: Any, device: int, ring_bytes: int, batch: BatchCopier | None = None
    ) -> None:
        self.torch = torch
        self.device = device
        self.batch = batch
        self.pairs: list[IndexPair] = []
        rows = _capacity(ring_bytes // ROW_BYTES_COVERED)
        pinned, on_gpu = self._buffers(INITIAL_PAIRS * rows)
        for i in range(INITIAL_PAIRS):
            part = slice(i * rows, (i + 1) * rows)
            self.pairs.append(IndexPair(pinned[part], on_gpu[part], rows, torch.cuda.Event()))

    @property
    def nbytes(self) -> int:
        """Bytes of each side (host, device) of every pair together."""
        return 8 * sum(pair.capacity for pair in self.pairs)

    def _buffers(self, rows: int) -> tuple[Any, Any]:
        torch = self.torch
        host = torch.empty(rows, dtype=torch.int64, pin_memory=True)
        return host, torch.empty(rows, dtype=torch.int64, device=f"cuda:{self.device}")

    def _make(self, rows: int) -> IndexPair:
        capacity = _capacity(rows)
        host, device = self._buffers(capacity)
        pair = IndexPair(host, device, capacity, self.torch.cuda.Event())
        self.pairs.append(pair)
        return pair

    def upload(self, rows: Int64Array, stream: Any) -> tuple[IndexPair, Any]:
        """``rows`` on the GPU, enqueued on ``stream`` (which must also run every kernel that
        reads them): the pair taken, and its device buffer's first ``len(rows)`` elements.
        Give the pair back with :meth:`release` once those kernels are enqueued."""
        n = len(rows)
        pair = next(
            (p for p in self.pairs if not p.taken and p.capacity >= n and p.done.query()), None
        )
        if pair is None:
            pair = self._make(n)
        pair.taken = True
        pair.rows[:n] = rows
        index = pair.device[:n]
        if self.batch is not None and stream.cuda_stream:  # none on the legacy default stream
            dst, src, size = pair.call
            size[0] = 8 * n
            self.batch.copy(dst, src, size, stream.cuda_stream)
        else:
            with self.torch.cuda.stream(stream):
                index.copy_(pair.host[:n], non_blocking=True)
        return pair, index

    def release(self, pair: IndexPair, stream: Any) -> None:
        """``pair``'s last use is what ``stream`` holds now: it is reused once that ran."""
        pair.done.record(stream)
        pair.taken = False


def _capacity(rows: int) -> int:
    """A pair's rows for ``rows``: a power of two, at least :data:`MIN_ROWS`."""
    return max(MIN_ROWS, 1 << max(0, rows - 1).bit_length())
