"""StagingArea: pages of many fragments through one registered host buffer, a buffer per page.

Mooncake's tcp transport pays per buffer: a ``layer_first`` page of 128 fragments of 128 KiB
is 128 transfers with the ``*_multi_buffers`` calls. Staged, the page is gathered into a slot
of a registered staging buffer (one numpy copy of a strided view of the pool) and put as one
16 MiB buffer; a restore reads each page as one buffer into a slot and scatters it into the
pool on a copy thread while the next call is on the wire. An object's bytes are the same
either way (the page's fragments in plane order, :mod:`.objects`), so staged and unstaged
clients share keys and read each other's pages.

Memory: ``staging_bytes`` per staged pool, taken and registered when the pool is attached, cut
into ``slots`` slots of ``slot_pages`` pages (one store call each). A batch holds at most one
slot while it waits for one, so batches in flight never deadlock over slots however few there
are; a batch that already holds a slot reuses its own oldest once that one is scattered.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from kvcr_policy.plugin_api import PoolError, PoolSpec, fragment_planes

from .client import StoreClient
from .codes import describe

__all__ = ["StagedBatch", "StagingArea"]


class StagingArea:
    """One staged pool's staging buffer; see the module docstring."""

    def __init__(self, client: StoreClient, spec: PoolSpec, nbytes: int, threads: int) -> None:
        g = spec.geometry
        page = g.page_bytes
        if nbytes < page:
            message = (
                f"pool {spec.name!r}: backend.options.staging_bytes ({nbytes} bytes) holds no "
                f"page of it ({page} bytes); set it to at least {page} bytes (two pages or "
                "more let a restore scatter one call while the next is on the wire), or "
                "backend.options.staging = 'never'"
            )
            raise PoolError(message)
        pages = nbytes // page
        self.slots = max(1, min(pages, 2 * threads))  # two per batch in flight
        self.slot_pages = pages // self.slots
        self.page_bytes = page
        self.name = spec.name
        self.client = client
        self.planes = fragment_planes(
            spec.geometry, spec.endpoint.address, spec.endpoint.nbytes, spec.name
        )
        self.buffer = np.empty(self.slots * self.slot_pages * page, dtype=np.uint8)
        self.buffer.fill(0)  # touched now, so the first calls do not pay its page faults
        self.address = int(self.buffer.ctypes.data)
        code = client.register(self.address, self.buffer.nbytes)
        if code != 0:
            message = (
                f"pool {spec.name!r}: Mooncake could not register its staging area "
                f"({self.buffer.nbytes} bytes, backend.options.staging_bytes): {describe(code)}; "
                "lower staging_bytes or set backend.options.staging = 'never'"
            )
            raise PoolError(message)
        self.views = self.buffer.reshape(self.slots, self.slot_pages, g.fragments_per_page, -1)
        self._free = list(range(self.slots))
        self._cond = threading.Condition()
        self.copier = ThreadPoolExecutor(threads, thread_name_prefix="kvcr-mooncake-staging")

    def take(self, wait: bool) -> int | None:
        """A free slot; None at once when none is free and not ``wait``."""
        with self._cond:
            if not wait and not self._free:
                return None
            self._cond.wait_for(lambda: bool(self._free))
            return self._free.pop()

    def give(self, slot: int) -> None:
        with self._cond:
            self._free.append(slot)
            self._cond.notify()

    def pointers(self, slot: int, count: int) -> list[int]:
        start = self.address + slot * self.slot_pages * self.page_bytes
        return [start + i * self.page_bytes for i in range(count)]

    def gather(self, slot: int, pages: Sequence[int]) -> None:
        view = self.views[slot]
        for i, page in enumerate(pages):
            np.copyto(view[i], self.planes[:, page])  # numpy copies without the GIL

    def scatter(self, slot: int, pages: Sequence[int], arrived: Sequence[bool]) -> None:
        view = self.views[slot]
        for i, (page, ok) in enumerate(zip(pages, arrived, strict=True)):
            if ok:
                np.copyto(self.planes[:, page], view[i])

    def describe(self) -> dict[str, Any]:
        return {"bytes": self.buffer.nbytes, "slots": self.slots, "slot_pages": self.slot_pages}

    def close(self) -> None:
        """After every batch finished: stop the copy threads, unregister the buffer."""
        self.copier.shutdown(wait=True)
        self.client.unregister(self.address)


class StagedBatch:
    """The store calls of one batch through a :class:`StagingArea`; :meth:`close` waits for
    its scatters (so the batch's pages are in the pool when its future resolves) and gives
    its slots back."""

    def __init__(self, area: StagingArea) -> None:
        self.area = area
        self.pending: deque[tuple[Future[None], int]] = deque()

    def _slot(self) -> int:
        slot = self.area.take(wait=not self.pending)
        if slot is None:  # none free and this batch holds some: its oldest, once scattered
            future, slot = self.pending.popleft()
            try:
                future.result()
            except BaseException:
                self.area.give(slot)
                raise
        return slot

    def get(self, objects: list[str], pages: Sequence[int]) -> list[int]:
        area = self.area
        slot = self._slot()
        try:
            sizes = [area.page_bytes] * len(pages)
            codes = area.client.get(objects, area.pointers(slot, len(pages)), sizes, False)
            arrived = [code == area.page_bytes for code in codes]
            future = area.copier.submit(area.scatter, slot, list(pages), arrived)
        except BaseException:
            area.give(slot)
            raise
        self.pending.append((future, slot))
        return codes

    def put(self, objects: list[str], pages: Sequence[int]) -> list[int]:
        area = self.area
        slot = self._slot()
        try:
            area.gather(slot, pages)
            sizes = [area.page_bytes] * len(pages)
            return area.client.put(objects, area.pointers(slot, len(pages)), sizes, False)
        finally:
            area.give(slot)

    def close(self) -> None:
        error: BaseException | None = None
        while self.pending:
            future, slot = self.pending.popleft()
            try:
                future.result()
            except BaseException as err:  # every slot goes back; the first error is raised
                error = error or err
            finally:
                self.area.give(slot)
        if error is not None:
            raise error
