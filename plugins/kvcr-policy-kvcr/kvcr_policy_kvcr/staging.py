"""StagingArea: pages of many fragments as one KVCR element each, through a registered buffer.

KVCR 0.1.1 pays per element (deliver, fetch and release each walk every element of a block): a
``layer_first`` page of 32 fragments of 16 KiB is 32 elements. Staged, a store gathers each page
into a slot of the staging buffer (one numpy copy of a strided view of the pool) and deposits it
as a block of one element of ``page_bytes``; a restore delivers that one element into a slot and
scatters it into the pool's fragments. The staging buffer is the pool's framework registration
in KVCR (the pool buffer itself is not registered), and KVCR's DRAM slots are whole pages.

A staged block's bytes are the page's fragments in plane order, but its element layout differs
from the unstaged form (one element, not one per fragment), so the form is fixed per pool when
it is attached and staged blocks are keyed apart (:mod:`.keys`): a reader of the other form
misses them, it never reads them as fragments.

Memory: ``staging_bytes`` per staged pool, taken and registered when the pool is attached, cut
into page-sized slots (at most :data:`MAX_SLOTS`). A call takes all its slots at once (at most
every slot: a larger batch moves in parts), so calls in flight never deadlock over slots, and
gives them back as soon as its bytes are in the pool (restore) or in KVCR (store). A slot whose
KVCR call never completed may still be written by KVCR: it is retired, never handed out again,
and reported.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
from kvcr.types import MemoryRef, RegionDescriptor

from kvcr_policy.plugin_api import (
    PoolError,
    PoolSpec,
    TransportError,
    fragment_planes,
)

__all__ = ["MAX_SLOTS", "StagingArea"]

#: The most slots of an area (tiny pages would make millions): more would only cost bookkeeping.
MAX_SLOTS = 1 << 16


class StagingArea:
    """One staged pool's staging buffer; see the module docstring."""

    def __init__(self, spec: PoolSpec, nbytes: int, pool: str, agent: str) -> None:
        g = spec.geometry
        page = g.page_bytes
        if nbytes < page:
            message = (
                f"pool {spec.name!r}: backend.options.staging_bytes ({nbytes} bytes) holds no "
                f"page of it ({page} bytes); set it to at least {page} bytes (a batch's pages "
                "at once or more, so that a call moves a whole batch), or "
                "backend.options.staging = 'never'"
            )
            raise PoolError(message)
        self.slots = min(nbytes // page, MAX_SLOTS)
        self.page_bytes = page
        self.planes = fragment_planes(
            spec.geometry, spec.endpoint.address, spec.endpoint.nbytes, spec.name
        )
        self.buffer = np.empty(self.slots * page, dtype=np.uint8)
        self.buffer.fill(0)  # touched now, so the first calls do not pay its page faults
        self.views = self.buffer.reshape(self.slots, g.fragments_per_page, g.fragment_bytes)
        self.label = pool
        self.refs = [
            MemoryRef(end_point_name=agent, label=pool, element_index=i) for i in range(self.slots)
        ]
        self._free = deque(range(self.slots))
        self._retired: set[int] = set()
        self._cond = threading.Condition()
        self.peak_taken = 0

    def region(self) -> RegionDescriptor:
        """The staging buffer as KVCR's framework registration: one element per slot."""
        address = int(self.buffer.ctypes.data)
        size, count = self.page_bytes, self.slots
        return RegionDescriptor(addr=address, size=size, count=count, label=self.label)

    def take(self, count: int, wait: bool) -> list[int] | None:
        """``count`` free slots (at most every usable one), waiting until that many are free;
        None at once when they are not free and not ``wait``."""
        with self._cond:
            if not wait and len(self._free) < count and count <= self._usable():
                return None
            self._cond.wait_for(lambda: len(self._free) >= count or count > self._usable())
            if count > self._usable():
                message = (
                    f"staging area of pool {self.label!r}: {count} slots asked, "
                    f"{self._usable()} usable ({len(self._retired)} retired after KVCR calls "
                    "that never completed)"
                )
                raise TransportError(message)
            taken = [self._free.popleft() for _ in range(count)]
            self.peak_taken = max(self.peak_taken, self.slots - len(self._free))
            return taken

    def _usable(self) -> int:
        return self.slots - len(self._retired)

    def give(self, slots: Sequence[int], retire: bool = False) -> None:
        """Slots back; ``retire``: KVCR may still write them, never hand them out again."""
        with self._cond:
            if retire:
                self._retired.update(slots)
            else:
                self._free.extend(slots)
            self._cond.notify_all()

    def part(self) -> int:
        """The most pages one call moves (every usable slot)."""
        with self._cond:
            return max(1, self._usable())

    def gather(self, slots: Sequence[int], pages: Sequence[int]) -> None:
        for slot, page in zip(slots, pages, strict=True):
            np.copyto(self.views[slot], self.planes[:, page])  # numpy copies without the GIL

    def scatter(self, slots: Sequence[int], pages: Sequence[int]) -> None:
        for slot, page in zip(slots, pages, strict=True):
            np.copyto(self.planes[:, page], self.views[slot])

    def describe(self) -> dict[str, Any]:
        with self._cond:
            return {
                "bytes": self.buffer.nbytes,
                "slots": self.slots,
                "peak_slots_taken": self.peak_taken,
                "retired_slots": len(self._retired),
            }
