"""Staging: pages moved through a contiguous area, each page's pieces end to end.

A page that is many small pieces where it lives (a ``layer_first`` page is one fragment per
layer and K/V) often moves faster as one run: KVCR and Mooncake store it as one element or
buffer, the cuda transport crosses PCIe in whole host runs, and SGLang's generic path moves a
host pool whose layout kvcr_policy does not model through a stand-in pool of whole pages. Each
lays a page out the same way, its pieces end to end in order (:func:`packed`), and the host
paths share the rest:

- :class:`StagingArea`: a host buffer cut into ``slots`` slots of ``slot_pages`` rows, a row
  one page (``page_bytes``). A call takes the slots it needs all at once and waits only while
  it holds none, so calls in flight never deadlock over slots however few there are; it gives
  them back as soon as its bytes moved, or retires a slot that an engine may still write (a
  call that never completed): a retired slot is never handed out again.
- :class:`PagePlanes`: a pool whose layout the geometry models, seen as ``(fragments, pages,
  fragment_bytes)`` without a copy; :meth:`PagePlanes.gather` copies pages into rows of an
  area, :meth:`PagePlanes.scatter` copies rows back (one numpy copy per page, the GIL
  released).
- :func:`stages_pages`: whether a backend's ``staging`` option sends a pool's pages this way.

What each caller does per part (a KVCR call, a Mooncake call, a pipeline call, a device ring
fill) stays with it.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..config.fields import size_field
from ..errors import PoolError, TransportError
from ..geometry import PoolGeometry
from .base import PoolSpec

__all__ = [
    "PagePlanes",
    "StagingArea",
    "fragment_planes",
    "packed",
    "stages_pages",
    "staging_below_field",
    "staging_bytes_field",
    "staging_pages",
]

Int64Array = npt.NDArray[np.int64]
#: Rows or pages: a list of ints or an int64 array.
Indices = Sequence[int] | Int64Array


def packed(lengths: Int64Array) -> Int64Array:
    """Where each piece of ``lengths`` starts when the pieces are laid end to end, in order:
    the staging offset of every piece of a page, page after page (a page whose pieces add up
    to ``page_bytes`` then fills exactly one row)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.cumsum(lengths) - lengths


def staging_pages(name: str, page_bytes: int, nbytes: int, why: str) -> int:
    """How many pages of ``page_bytes`` a backend's staging area of ``nbytes`` (its
    ``backend.options.staging_bytes``) holds for pool ``name``: at least one, else a
    :class:`PoolError` that says how much to set and ``why`` more helps."""
    if nbytes < page_bytes:
        message = (
            f"pool {name!r}: backend.options.staging_bytes ({nbytes} bytes) holds no page of it "
            f"({page_bytes} bytes); set it to at least {page_bytes} bytes ({why}), or "
            "backend.options.staging = 'never'"
        )
        raise PoolError(message)
    return nbytes // page_bytes


def staging_bytes_field(default: int, registered: str = "") -> Any:
    """A backend's ``staging_bytes`` option: its staging area per staged pool (at most 1TiB),
    taken and registered (``registered``: with what, e.g. ``" with KVCR"``) on attach."""
    return size_field(
        default,
        1 << 40,
        "Host memory of the staging area of each staged pool (at most 1TiB; at least one "
        f"page), taken and registered{registered} once, when the pool is attached.",
    )


def staging_below_field(default: int, why: str = "") -> Any:
    """A backend's ``staging_below_bytes`` option: under ``staging = 'auto'``, the fragment
    size below which a page is staged (at most 1TiB); ``why`` explains the default."""
    more = f"; {why}" if why else "."
    return size_field(
        default,
        1 << 40,
        f"auto: stage pages whose fragments are smaller than this (at most 1TiB){more}",
    )


def fragment_planes(geometry: PoolGeometry, address: int, nbytes: int, name: str) -> np.ndarray:
    """The pool buffer of ``nbytes`` at host ``address`` as ``(fragments_per_page, pages,
    fragment_bytes)`` bytes, no copy: ``[f, p]`` is fragment ``f`` of page ``p`` (the layout of
    :func:`~kvcr_policy.geometry.fragment_offsets`), so a page's fragments gather or scatter
    with one numpy call.

    Raises PoolError (naming pool ``name``) when the geometry reaches past the buffer.
    """
    g = geometry
    end = (g.fragments_per_page - 1) * g.plane_bytes + g.pages * g.fragment_bytes
    if end > nbytes:
        message = (
            f"pool {name!r}: its fragments reach byte {end}, past its {nbytes} bytes; the "
            "geometry does not describe this buffer"
        )
        raise PoolError(message)
    raw = (ctypes.c_uint8 * nbytes).from_address(address)
    flat = np.frombuffer(memoryview(raw), dtype=np.uint8)
    shape = (g.fragments_per_page, g.pages, g.fragment_bytes)
    strides = (g.plane_bytes, g.fragment_bytes, 1)
    return np.lib.stride_tricks.as_strided(flat, shape, strides, writeable=True)


def stages_pages(mode: str, geometry: PoolGeometry, below_bytes: int) -> bool:
    """Whether a backend's ``staging`` option (``never``, ``auto``, ``always``) gathers this
    pool's pages through a staging area: never a page of one fragment (one run already);
    ``auto`` only pages whose fragments are smaller than ``below_bytes``."""
    if mode == "never" or geometry.fragments_per_page == 1:
        return False
    return mode == "always" or geometry.fragment_bytes < below_bytes


class StagingArea:
    """``slots`` slots of ``slot_pages`` rows of ``page_bytes`` in one host buffer; see the
    module docstring. ``name`` says whose area it is in messages."""

    def __init__(self, name: str, page_bytes: int, slots: int, slot_pages: int = 1) -> None:
        if page_bytes < 1 or slots < 1 or slot_pages < 1:
            message = (
                f"staging area of {name}: expected at least one slot of one page of at least "
                f"one byte, got {slots} slots of {slot_pages} pages of {page_bytes} bytes"
            )
            raise ValueError(message)
        self.name = name
        self.page_bytes = page_bytes
        self.slots = slots
        self.slot_pages = slot_pages
        self.buffer = np.empty(slots * slot_pages * page_bytes, dtype=np.uint8)
        self.buffer.fill(0)  # touched now, so the first calls do not pay its page faults
        self.address = int(self.buffer.ctypes.data)
        #: Every row, ``rows[i]`` the bytes of row ``i`` (slot ``s`` holds rows
        #: ``s * slot_pages`` to ``(s + 1) * slot_pages``).
        self.rows = self.buffer.reshape(slots * slot_pages, page_bytes)
        self._free: deque[int] = deque(range(slots))
        self._retired: set[int] = set()
        self._cond = threading.Condition()
        self.peak_taken = 0

    @property
    def nbytes(self) -> int:
        return self.buffer.nbytes

    def slot_rows(self, slot: int, count: int | None = None) -> Int64Array:
        """The first ``count`` rows of ``slot`` (all of them by default)."""
        first = slot * self.slot_pages
        stop = first + (self.slot_pages if count is None else count)
        return np.arange(first, stop, dtype=np.int64)

    def slot_bytes(self, slot: int) -> npt.NDArray[np.uint8]:
        """``slot``'s bytes, its rows end to end."""
        size = self.slot_pages * self.page_bytes
        return self.buffer[slot * size : (slot + 1) * size]

    def row_addresses(self, rows: Indices) -> list[int]:
        """The host address of each row."""
        return [self.address + int(row) * self.page_bytes for row in rows]

    def take(self, count: int = 1, *, wait: bool) -> list[int] | None:
        """``count`` free slots, waiting until that many are free; None at once when they are
        not free and not ``wait`` (a caller that holds slots already: it finishes one of its
        own first). More than the usable slots raises :class:`TransportError`."""
        with self._cond:
            if not wait and len(self._free) < count and count <= self._usable():
                return None
            self._cond.wait_for(lambda: len(self._free) >= count or count > self._usable())
            if count > self._usable():
                message = (
                    f"staging area of {self.name}: {count} slots asked, {self._usable()} "
                    f"usable ({len(self._retired)} retired after calls that never completed)"
                )
                raise TransportError(message)
            taken = [self._free.popleft() for _ in range(count)]
            self.peak_taken = max(self.peak_taken, self.slots - len(self._free))
            return taken

    def give(self, slots: Sequence[int], retire: bool = False) -> None:
        """Slots back; ``retire``: something may still write them, never hand them out again."""
        with self._cond:
            if retire:
                self._retired.update(slots)
            else:
                self._free.extend(slots)
            self._cond.notify_all()

    def usable(self) -> int:
        """Slots not retired: the most one call may take."""
        with self._cond:
            return max(1, self._usable())

    def _usable(self) -> int:
        return self.slots - len(self._retired)

    def describe(self) -> dict[str, Any]:
        with self._cond:
            return {
                "bytes": self.buffer.nbytes,
                "slots": self.slots,
                "slot_pages": self.slot_pages,
                "peak_slots_taken": self.peak_taken,
                "retired_slots": len(self._retired),
            }


class PagePlanes:
    """The pages of a pool the geometry models (``geometry``, its buffer of ``nbytes`` at host
    ``address``), gathered into and scattered from the rows of a :class:`StagingArea` whose
    rows are its pages."""

    def __init__(self, geometry: PoolGeometry, address: int, nbytes: int, name: str) -> None:
        self.planes = fragment_planes(geometry, address, nbytes, name)
        self.fragments = geometry.fragments_per_page
        self.fragment_bytes = geometry.fragment_bytes

    @classmethod
    def of(cls, spec: PoolSpec) -> PagePlanes:
        """The pages of the pool ``spec`` names (its endpoint's host memory)."""
        return cls(spec.geometry, spec.endpoint.address, spec.endpoint.nbytes, spec.name)

    def _rows(self, area: StagingArea) -> np.ndarray:
        return area.buffer.reshape(-1, self.fragments, self.fragment_bytes)

    def gather(self, area: StagingArea, rows: Indices, pages: Indices) -> None:
        """Copy each page of ``pages`` into the row of ``rows`` beside it."""
        views = self._rows(area)
        for row, page in zip(rows, pages, strict=True):
            np.copyto(views[row], self.planes[:, page])  # numpy copies without the GIL

    def scatter(
        self,
        area: StagingArea,
        rows: Indices,
        pages: Indices,
        arrived: Sequence[bool] | None = None,
    ) -> None:
        """Copy each row of ``rows`` into the page of ``pages`` beside it (where ``arrived``
        says its bytes arrived, when given)."""
        views = self._rows(area)
        for i, (row, page) in enumerate(zip(rows, pages, strict=True)):
            if arrived is None or arrived[i]:
                np.copyto(self.planes[:, page], views[row])
