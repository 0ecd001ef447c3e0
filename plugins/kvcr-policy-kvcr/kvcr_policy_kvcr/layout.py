"""PageLayout: how one pool's pages are described to KVCR.

A KVCR block is a list of fixed-size elements of registered memory (``MemoryRef``), each as
large as the pool's block size, and KVCR keeps one local DRAM slot per element. A page of a
:class:`~kvcr_policy.geometry.PoolGeometry` is ``fragments_per_page`` contiguous fragments, one
per plane, and every plane is ``pages`` fragments back to back; so the whole pool buffer is one
registration of ``planes x pages`` elements of ``fragment_bytes``, and fragment ``f`` of page
``p`` is element ``f * pages + p`` (its byte offset divided by the fragment size). A page of one
fragment is a block of one unlabelled element (what KVCR's G3 tier requires); otherwise fragment
``f`` is the part ``<pool>:<f>`` of the block, all parts sharing the registration ``<pool>:*``.
A staged pool (:mod:`.staging`) is seen as pages of one element of ``page_bytes`` each, in its
staging area. The ``MemoryRef`` of each element is made once (up to ``CACHED_REFS``) and reused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from kvcr.types import MemoryRef, RegionDescriptor

from kvcr_policy.plugin_api import Descriptors, PoolGeometry, UnsupportedError, key_part

__all__ = ["CACHED_REFS", "PageLayout", "kvcr_pool_name"]

#: The most ``MemoryRef`` a layout keeps (about 13 MB); elements past it get a new one per batch.
CACHED_REFS = 1 << 16


def kvcr_pool_name(name: str) -> str:
    """A pipeline pool name as a KVCR pool name, which may not contain a colon and also names
    the pool's G3 files: percent-encoded (:func:`kvcr_policy.plugin_api.key_part`), so it holds
    neither ``:`` nor ``/`` and two pools never share one (``a:b`` and ``a_b`` once did)."""
    return key_part(name)


@dataclass(frozen=True, slots=True)
class PageLayout:
    """The KVCR view of one pool: its KVCR pool name, agent, element size and part labels."""

    pool: str
    agent: str
    geometry: PoolGeometry
    staged: bool = False
    _refs: dict[int, MemoryRef] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def element_bytes(self) -> int:
        return self.geometry.page_bytes if self.staged else self.geometry.fragment_bytes

    @property
    def elements_per_page(self) -> int:
        return 1 if self.staged else self.geometry.fragments_per_page

    @property
    def labels(self) -> list[str]:
        planes = self.elements_per_page
        return [self.pool] if planes == 1 else [f"{self.pool}:{f}" for f in range(planes)]

    def framework_region(self, address: int) -> RegionDescriptor:
        """The pool buffer as one registration of every fragment of every page."""
        g = self.geometry
        label = self.pool if g.fragments_per_page == 1 else f"{self.pool}:*"
        count = g.fragments_per_page * g.pages
        return RegionDescriptor(addr=address, size=g.fragment_bytes, count=count, label=label)

    def refs(self, shaped: Descriptors, pool_side: np.ndarray) -> list[list[MemoryRef]]:
        """Per page of a batch, the elements of its fragments, from the batch's descriptors.

        ``pool_side`` is ``shaped.dst`` for a read (pool pages receive) or ``shaped.src`` for a
        write. KVCR moves whole elements only, so every descriptor must be one fragment.
        """
        size = self.element_bytes
        planes = self.geometry.fragments_per_page
        if len(shaped) % planes or (shaped.length != size).any() or (pool_side % size).any():
            message = (
                f"pool {self.pool!r}: KVCR moves whole fragments of {size} bytes, one element "
                "each, but the batch's descriptors were merged or cut (a coalescing strategy "
                "that ignored what the backend accepts); use coalescing.strategy = 'none'"
            )
            raise UnsupportedError(message)
        elements = (pool_side // size).reshape(planes, -1).T.tolist()
        agent, labels, cache = self.agent, self.labels, self._refs
        refs = []
        for row in elements:
            page = []
            for part, element in enumerate(row):
                ref = cache.get(element)  # an element index names its part too
                if ref is None:
                    ref = MemoryRef(end_point_name=agent, label=labels[part], element_index=element)
                    if len(cache) < CACHED_REFS:  # dict writes are atomic under the GIL
                        cache[element] = ref
                page.append(ref)
            refs.append(page)
        return refs
