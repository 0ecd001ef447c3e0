"""Transfer descriptors: a copy plan as parallel int64 arrays, built and reshaped vectorised.

A transfer between a pool buffer and a tier buffer is a list of ``(src, dst, length)`` byte
ranges. On a GPU the number of copy calls decides the rate (one 16 KiB fragment per call moves
about 1 GB/s, one coalesced copy per layer about 54 GB/s, measured on an H200), so plans are
numpy arrays, built without a Python loop per page or fragment, then *coalesced* (runs contiguous
on both sides merged) and *split* (pieces no larger than a transport's message limit).

Each descriptor also carries:

- ``bound``: an id coalescing never merges across. :func:`build_descriptors` gives each fragment
  plane its own id (so K never merges into V, nor layer ``l`` into ``l+1``); callers planning
  several pools or regions in one array offset the ids with ``bound_base`` so they stay apart.
- ``page`` / ``page_end``: the half-open range of positions, in the request's page list, whose
  bytes the descriptor carries. Built descriptors cover one page each; a coalesced one covers the
  hull of its members; a split piece keeps its parent's range. The range is therefore a superset:
  when a descriptor fails, every page in its range is treated as not delivered, which is what the
  per-page fallback needs (only pages that really arrived may count).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from kvcr_policy.errors import ArgumentError, PoolError, UsageError
from kvcr_policy.geometry import PoolGeometry, check_pages, fragment_offsets

__all__ = [
    "Descriptors",
    "build_descriptors",
    "coalesce",
    "slot_descriptors",
    "split",
    "split_pieces",
]

Int64Array = npt.NDArray[np.int64]

# The geometry fields that decide where a page's bytes are; tokens, name and device may differ
# between a pool and the tier that mirrors it.
_LAYOUT_FIELDS = ("layout", "layers", "heads", "head_dim", "dtype", "page_size", "mla")


@dataclass(frozen=True, slots=True)
class Descriptors:
    """Parallel int64 arrays, one entry per copy: ``src[i]..src[i]+length[i]`` to ``dst[i]``.

    Offsets are relative to the source and destination buffers. The arrays are shared, not
    copied: treat them as read-only once wrapped.
    """

    src: Int64Array
    dst: Int64Array
    length: Int64Array
    bound: Int64Array
    page: Int64Array
    page_end: Int64Array

    def __post_init__(self) -> None:
        n = len(self.src)
        for field in fields(self):
            array = getattr(self, field.name)
            if not isinstance(array, np.ndarray) or array.dtype != np.int64 or array.ndim != 1:
                got = getattr(array, "dtype", type(array).__name__)
                message = f"Descriptors.{field.name}: expected a 1-D int64 array, got {got}"
                raise UsageError(message)
            if len(array) != n:
                message = (
                    f"Descriptors.{field.name}: expected length {n} (as src), got {len(array)}"
                )
                raise ArgumentError(message)

    @classmethod
    def from_arrays(
        cls,
        src: npt.ArrayLike,
        dst: npt.ArrayLike,
        length: npt.ArrayLike,
        *,
        bound: npt.ArrayLike | None = None,
        page: npt.ArrayLike | None = None,
        page_end: npt.ArrayLike | None = None,
    ) -> Descriptors:
        """Wrap array-likes as int64; by default one bound for all and one page per descriptor."""
        src_array = np.asarray(src, dtype=np.int64).reshape(-1)
        n = len(src_array)
        page_array = np.arange(n, dtype=np.int64) if page is None else _int64(page)
        return cls(
            src=src_array,
            dst=_int64(dst),
            length=_int64(length),
            bound=np.zeros(n, dtype=np.int64) if bound is None else _int64(bound),
            page=page_array,
            page_end=page_array + 1 if page_end is None else _int64(page_end),
        )

    @classmethod
    def empty(cls) -> Descriptors:
        """No descriptors."""
        return cls.from_arrays([], [], [])

    @classmethod
    def concat(cls, *descs: Descriptors) -> Descriptors:
        """All descriptors of ``descs``, in order (bounds and page positions are kept as given)."""
        if not descs:
            return cls.empty()
        return cls(
            **{f.name: np.concatenate([getattr(d, f.name) for d in descs]) for f in fields(cls)}
        )

    def take(self, which: npt.ArrayLike) -> Descriptors:
        """The descriptors selected by a boolean mask or an index array, in that order."""
        selector = np.asarray(which)
        if selector.dtype != np.bool_:
            selector = selector.astype(np.int64, copy=False)
        return Descriptors(**{f.name: getattr(self, f.name)[selector] for f in fields(self)})

    def __len__(self) -> int:
        return len(self.src)

    @property
    def nbytes(self) -> int:
        """Bytes moved by all descriptors together."""
        return int(self.length.sum())


def _int64(values: npt.ArrayLike) -> Int64Array:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def build_descriptors(
    src_geometry: PoolGeometry,
    src_pages: npt.ArrayLike,
    dst_geometry: PoolGeometry,
    dst_pages: npt.ArrayLike,
    *,
    bound_base: int = 0,
) -> Descriptors:
    """One descriptor per fragment copying page ``src_pages[i]`` to page ``dst_pages[i]``.

    The geometries must lay a page out identically (all but name, tokens and device equal).
    Order is fragment-major: every page of fragment 0, then of fragment 1, and so on, so pages
    consecutive on both sides are adjacent descriptors that :func:`coalesce` merges. Fragment
    ``f`` gets bound ``bound_base + f``; ``page`` is the page's position in the request.
    """
    src_array, dst_array = _paired_pages(src_geometry, src_pages, dst_geometry, dst_pages)
    n = len(src_array)
    planes = src_geometry.fragments_per_page
    # ravel() of the (planes, n) offset matrices is the fragment-major order.
    src = fragment_offsets(src_geometry, src_array).ravel()
    dst = fragment_offsets(dst_geometry, dst_array).ravel()
    page = np.tile(np.arange(n, dtype=np.int64), planes)
    return Descriptors(
        src=src,
        dst=dst,
        length=np.full(planes * n, src_geometry.fragment_bytes, dtype=np.int64),
        bound=np.repeat(np.arange(planes, dtype=np.int64) + bound_base, n),
        page=page,
        page_end=page + 1,
    )


def _paired_pages(
    src_geometry: PoolGeometry,
    src_pages: npt.ArrayLike,
    dst_geometry: PoolGeometry,
    dst_pages: npt.ArrayLike,
) -> tuple[Int64Array, Int64Array]:
    """Both page lists, checked: equal page layouts, pages in range, as many on each side."""
    mismatched = [
        f"{name} {getattr(src_geometry, name)!r} vs {getattr(dst_geometry, name)!r}"
        for name in _LAYOUT_FIELDS
        if getattr(src_geometry, name) != getattr(dst_geometry, name)
    ]
    if mismatched:
        message = (
            f"pools {src_geometry.name!r} and {dst_geometry.name!r} lay pages out differently: "
            f"{'; '.join(mismatched)}; expected equal layouts (a tier mirrors its pool)"
        )
        raise PoolError(message)
    src_array = check_pages(src_geometry, src_pages)
    dst_array = check_pages(dst_geometry, dst_pages)
    if len(src_array) != len(dst_array):
        message = (
            f"pools {src_geometry.name!r} -> {dst_geometry.name!r}: expected as many destination "
            f"pages as source pages ({len(src_array)}), got {len(dst_array)}"
        )
        raise PoolError(message)
    return src_array, dst_array


def slot_descriptors(
    pool: PoolGeometry,
    pages: npt.ArrayLike,
    tier: PoolGeometry,
    slots: npt.ArrayLike,
    *,
    read: bool,
) -> Descriptors:
    """One descriptor per fragment copying page ``pages[i]`` of ``pool`` and slot ``slots[i]``
    of ``tier``, tier to pool when ``read``, else pool to tier, where the tier keeps each slot
    whole: fragment ``f`` of slot ``s`` at ``s * page_bytes + f * fragment_bytes`` (not
    mirroring the pool's planes as :func:`build_descriptors` does; the tier holds as many
    bytes either way). Checked as :func:`build_descriptors` checks; fragment ``f`` gets bound
    ``f``.

    Descriptors come page-major (every fragment of page 0, then of page 1, ...), so each slot
    is one run of adjacent descriptors, contiguous on the tier side, and slots stored together
    one longer run: a transport finds the runs without sorting. (Fragment-major order puts no
    two descriptors of a slot next to each other; coalescing merges none in either order.)
    Built directly in that order: this runs before each batch's first copy.
    """
    if read:
        slot_array, page_array = _paired_pages(tier, slots, pool, pages)
    else:
        page_array, slot_array = _paired_pages(pool, pages, tier, slots)
    n, planes = len(page_array), pool.fragments_per_page
    within = np.arange(planes, dtype=np.int64)
    pool_side = np.add.outer(page_array * pool.fragment_bytes, within * pool.plane_bytes)
    tier_side = np.add.outer(slot_array * tier.page_bytes, within * tier.fragment_bytes)
    page = np.repeat(np.arange(n, dtype=np.int64), planes)
    return Descriptors(
        src=(tier_side if read else pool_side).reshape(-1),
        dst=(pool_side if read else tier_side).reshape(-1),
        length=np.full(n * planes, pool.fragment_bytes, dtype=np.int64),
        bound=np.tile(within, n),
        page=page,
        page_end=page + 1,
    )


def coalesce(d: Descriptors) -> Descriptors:
    """Merge each run of adjacent descriptors contiguous in src and dst with the same bound.

    Order is never changed, so the copy moves the same bytes to the same places in the same
    order, in fewer calls.
    """
    if len(d) < 2:
        return d
    # Bounds first: where no two neighbours share one (a page's fragments, one plane each,
    # as a whole-slot tier's descriptors come), nothing merges and the ends need no sums.
    joins = d.bound[1:] == d.bound[:-1]
    if not joins.any():
        return d
    joins &= d.src[1:] == d.src[:-1] + d.length[:-1]
    joins &= d.dst[1:] == d.dst[:-1] + d.length[:-1]
    if not joins.any():
        return d
    starts = np.flatnonzero(np.concatenate(([True], ~joins)))
    return Descriptors(
        src=d.src[starts],
        dst=d.dst[starts],
        length=np.add.reduceat(d.length, starts),
        bound=d.bound[starts],
        # The hull of the members' page ranges; see the module docstring.
        page=np.minimum.reduceat(d.page, starts),
        page_end=np.maximum.reduceat(d.page_end, starts),
    )


def split(d: Descriptors, limit: int) -> Descriptors:
    """Cut every descriptor longer than ``limit`` bytes into pieces of at most ``limit``.

    All pieces but the last of a descriptor are exactly ``limit`` long; order is kept. A
    zero-length descriptor stays one piece.
    """
    if limit <= 0:
        message = f"split limit: expected a positive byte count, got {limit}"
        raise ArgumentError(message)
    if len(d) == 0 or int(d.length.max()) <= limit:
        return d
    pieces = np.maximum(1, -(-d.length // limit))
    parent = np.repeat(np.arange(len(d), dtype=np.int64), pieces)
    # Piece number within its parent: a global count minus where the parent's pieces begin.
    first_piece = np.cumsum(pieces) - pieces
    offset = (np.arange(len(parent), dtype=np.int64) - first_piece[parent]) * limit
    return Descriptors(
        src=d.src[parent] + offset,
        dst=d.dst[parent] + offset,
        length=np.minimum(limit, d.length[parent] - offset),
        bound=d.bound[parent],
        page=d.page[parent],
        page_end=d.page_end[parent],
    )


def split_pieces(d: Descriptors) -> int:
    """How many descriptors of ``d`` a :func:`split` added: pieces that continue their
    predecessor in both buffers, within the same bound and the same page range.

    Only a split makes such neighbours: :func:`coalesce` leaves none (it merges them), and
    descriptors built one per fragment cover different pages. So ``len(d) - split_pieces(d)``
    is the count after coalescing and before the split (used by the metrics).
    """
    if len(d) < 2:
        return 0
    follows = (
        (d.src[1:] == d.src[:-1] + d.length[:-1])
        & (d.dst[1:] == d.dst[:-1] + d.length[:-1])
        & (d.bound[1:] == d.bound[:-1])
        & (d.page[1:] == d.page[:-1])
        & (d.page_end[1:] == d.page_end[:-1])
    )
    return int(np.count_nonzero(follows))
