"""Staging: pages of many fragments as one KVCR element each, through a registered buffer.

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
and reported. The area and its pages are kvcr_policy's
(:class:`~kvcr_policy.plugin_api.StagingArea`, :class:`~kvcr_policy.plugin_api.PagePlanes`);
this module adds KVCR's registration of it.
"""

from __future__ import annotations

from typing import Any

from kvcr.types import MemoryRef, RegionDescriptor

from kvcr_policy.plugin_api import PagePlanes, PoolSpec, StagingArea, staging_pages

__all__ = ["MAX_SLOTS", "Staging"]

#: The most slots of an area (tiny pages would make millions): more would only cost bookkeeping.
MAX_SLOTS = 1 << 16


class Staging:
    """One staged pool's staging area (a page per slot), its pages and its KVCR elements; see
    the module docstring."""

    def __init__(self, spec: PoolSpec, nbytes: int, pool: str, agent: str) -> None:
        page = spec.geometry.page_bytes
        why = "a batch's pages at once or more, so that a call moves a whole batch"
        pages = staging_pages(spec.name, page, nbytes, why)
        self.area = StagingArea(f"pool {pool!r}", page, min(pages, MAX_SLOTS))
        self.pages = PagePlanes.of(spec)
        self.label = pool
        self.refs = [
            MemoryRef(end_point_name=agent, label=pool, element_index=i)
            for i in range(self.area.slots)
        ]

    def region(self) -> RegionDescriptor:
        """The staging buffer as KVCR's framework registration: one element per slot."""
        area = self.area
        return RegionDescriptor(
            addr=area.address, size=area.page_bytes, count=area.slots, label=self.label
        )

    def describe(self) -> dict[str, Any]:
        return self.area.describe()
