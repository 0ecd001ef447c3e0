"""Staging: pages of many fragments through one registered host buffer, a buffer per page.

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
are; a batch that already holds a slot reuses its own oldest once that one is scattered. The
area and its pages are kvcr_policy's (:class:`~kvcr_policy.plugin_api.StagingArea`,
:class:`~kvcr_policy.plugin_api.PagePlanes`); this module adds Mooncake's registration of the
area and the calls of one batch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from kvcr_policy.plugin_api import PagePlanes, PoolError, PoolSpec, StagingArea, staging_pages

from .client import StoreClient
from .codes import describe

__all__ = ["StagedBatch", "Staging"]


class Staging:
    """One staged pool's staging area, registered with Mooncake, and its copy threads; see
    the module docstring."""

    def __init__(self, client: StoreClient, spec: PoolSpec, nbytes: int, threads: int) -> None:
        page = spec.geometry.page_bytes
        why = "two pages or more let a restore scatter one call while the next is on the wire"
        pages = staging_pages(spec.name, page, nbytes, why)
        slots = max(1, min(pages, 2 * threads))  # two per batch in flight
        self.area = StagingArea(f"pool {spec.name!r}", page, slots, pages // slots)
        self.pages = PagePlanes.of(spec)
        self.client = client
        code = client.register(self.area.address, self.area.nbytes)
        if code != 0:
            message = (
                f"pool {spec.name!r}: Mooncake could not register its staging area "
                f"({self.area.nbytes} bytes, backend.options.staging_bytes): {describe(code)}; "
                "lower staging_bytes or set backend.options.staging = 'never'"
            )
            raise PoolError(message)
        self.copier = ThreadPoolExecutor(threads, thread_name_prefix="kvcr-mooncake-staging")

    @property
    def slot_pages(self) -> int:
        return self.area.slot_pages

    def describe(self) -> dict[str, Any]:
        return self.area.describe()

    def close(self) -> None:
        """After every batch finished: stop the copy threads, unregister the buffer."""
        self.copier.shutdown(wait=True)
        self.client.unregister(self.area.address)


class StagedBatch:
    """The store calls of one batch through a pool's :class:`Staging`; :meth:`close` waits for
    its scatters (so the batch's pages are in the pool when its future resolves) and gives
    its slots back."""

    def __init__(self, staging: Staging) -> None:
        self.staging = staging
        self.area = staging.area
        self.pending: deque[tuple[Future[None], int]] = deque()

    def _slot(self) -> int:
        taken = self.area.take(1, wait=not self.pending)
        if taken is None:  # none free and this batch holds some: its oldest, once scattered
            future, slot = self.pending.popleft()
            try:
                future.result()
            except BaseException:
                self.area.give([slot])
                raise
            return slot
        return taken[0]

    def get(self, objects: list[str], pages: Sequence[int]) -> list[int]:
        staging, area = self.staging, self.area
        slot = self._slot()
        try:
            rows = area.slot_rows(slot, len(pages))
            sizes = [area.page_bytes] * len(pages)
            codes = staging.client.get(objects, area.row_addresses(rows), sizes, False)
            arrived = [code == area.page_bytes for code in codes]
            future = staging.copier.submit(staging.pages.scatter, area, rows, list(pages), arrived)
        except BaseException:
            area.give([slot])
            raise
        self.pending.append((future, slot))
        return codes

    def put(self, objects: list[str], pages: Sequence[int]) -> list[int]:
        staging, area = self.staging, self.area
        slot = self._slot()
        try:
            rows = area.slot_rows(slot, len(pages))
            staging.pages.gather(area, rows, pages)
            sizes = [area.page_bytes] * len(pages)
            return staging.client.put(objects, area.row_addresses(rows), sizes, False)
        finally:
            area.give([slot])

    def close(self) -> None:
        error: BaseException | None = None
        while self.pending:
            future, slot = self.pending.popleft()
            try:
                future.result()
            except BaseException as err:  # every slot goes back; the first error is raised
                error = error or err
            finally:
                self.area.give([slot])
        if error is not None:
            raise error
