"""Shaped descriptor lists: what they must cover, checked before a byte moves, and which pages
a failed message fails.

The client hands each batch's plain descriptors (one per page fragment, see
:func:`~kvcr_policy.descriptors.build_descriptors`) to its coalescing strategy and moves what
comes back, merged and cut in any way. A list is accepted only if it moves exactly the bytes of
the plain list, which :meth:`Cover.check` verifies on one side of the transfer:

- the server, told the tier side only, checks that the ranges cover exactly the bytes of the
  slots it claimed or reserved for the request (:meth:`Cover.of_pages`), in shapes it accepts
  (``coalesce``: a range over several fragments; ``split``: part of one);
- the client, which knows both sides, checks the destination side and each range's shift
  (source minus destination offset) against the plain list (:meth:`Cover.of_moves`): every byte
  goes from the same source byte to the same destination byte, as often.

So nothing outside the request, nothing twice, nothing missed and nothing sent elsewhere. A
buffer is tiled by fragments (fragment ``f`` of page ``p`` is fragment number
``f * pages + p``), so the check needs no sort of the plain list: each range's first and last
fragment numbers are looked up among the request's (sorted pages, broadcast over the planes);
all fragments in between must be the request's with the range's shift, the ranges must not
overlap, and together they must hold as many bytes as the request. A request that names a page
twice (a read of a repeated key) is checked by a sweep instead: +1 at each range's start and -1
at its end, the opposite for the plain ranges, summed in (shift, offset) order, must stay zero.

:meth:`Cover.outcome` turns failed messages into failed pages from the bytes each message
covered (never from the ``page`` ranges a strategy returned): a page counts only if every
message that touched one of its bytes completed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from kvcr_policy.errors import KVCRPolicyError, PoolError, ProtocolError
from kvcr_policy.geometry import PoolGeometry, check_pages

from .payload import MAX_DESCRIPTORS

__all__ = ["Cover"]

Int64Array = npt.NDArray[np.int64]
ANY_SHAPE = frozenset({"coalesce", "split"})

#: Offsets above this are refused before any arithmetic (no int64 overflow).
_HUGE = 1 << 62


def _first_difference(
    a_start: Int64Array,
    a_length: Int64Array,
    a_key: Int64Array,
    b_start: Int64Array,
    b_length: Int64Array,
    b_key: Int64Array,
) -> tuple[int, int, int] | None:
    """None when lists ``a`` and ``b`` cover each (key, byte) equally often; else the first
    (key, offset) where they differ and how many more times ``a`` covers it there."""
    na, nb = len(a_start), len(b_start)
    if na + nb == 0:
        return None
    offset = np.concatenate((a_start, a_start + a_length, b_start, b_start + b_length))
    key = np.concatenate((a_key, a_key, b_key, b_key))
    one = np.ones(na, dtype=np.int64)
    other = np.ones(nb, dtype=np.int64)
    step = np.concatenate((one, -one, -other, other))
    order = np.lexsort((offset, key))
    offset, key, step = offset[order], key[order], step[order]
    new = np.ones(len(offset), dtype=bool)
    new[1:] = (offset[1:] != offset[:-1]) | (key[1:] != key[:-1])
    starts = np.flatnonzero(new)
    # Each key's steps sum to zero, so the running sum restarts at zero with every key.
    depth = np.cumsum(np.add.reduceat(step, starts))
    wrong = np.flatnonzero(depth)
    if len(wrong) == 0:
        return None
    first = starts[wrong[0]]
    return int(key[first]), int(offset[first]), int(depth[wrong[0]])


def _ints(values: object, what: str, name: str, error: type[KVCRPolicyError]) -> Int64Array:
    array = np.asarray(values)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        message = f"{what}: {name} must be a 1-D integer array, got {array.dtype} {array.shape}"
        raise error(message)
    return array.astype(np.int64, copy=False)


def _sorted_fragments(
    geometry: PoolGeometry, pages: object
) -> tuple[Int64Array, Int64Array, Int64Array]:
    """Fragment numbers of ``pages`` in ascending order, the page position of each, and the
    order that sorts the pages."""
    page_array = check_pages(geometry, pages)
    order = np.argsort(page_array, kind="stable").astype(np.int64)
    planes = np.arange(geometry.fragments_per_page, dtype=np.int64) * geometry.pages
    fragments = np.add.outer(planes, page_array[order]).ravel()  # sorted: pages < plane stride
    return fragments, np.tile(order, geometry.fragments_per_page), order


class _Ranges(NamedTuple):
    """Ranges under check and how to refuse them: ``error`` raised, ``what`` naming the list."""

    off: Int64Array
    length: Int64Array
    shift: Int64Array
    what: str
    error: type[KVCRPolicyError]


@dataclass(frozen=True, slots=True)
class Cover:
    """The fragments one side of one request may move: their numbers (sorted; repeated for a
    page named twice), each one's shift (source minus destination offset; 0 when only one side
    is known), the position of its page in the request, and the buffer they tile."""

    fragment_bytes: int
    fragments: Int64Array
    shift: Int64Array
    position: Int64Array
    count: int
    limit: int

    @classmethod
    def of_pages(cls, geometry: PoolGeometry, pages: object) -> Cover:
        """Every fragment of ``pages`` (checked in range) of a buffer laid out as ``geometry``."""
        fragments, position, order = _sorted_fragments(geometry, pages)
        zero = np.zeros(len(fragments), dtype=np.int64)
        return cls(geometry.fragment_bytes, fragments, zero, position, len(order), geometry.nbytes)

    @classmethod
    def of_moves(
        cls,
        src: PoolGeometry,
        src_pages: object,
        dst: PoolGeometry,
        dst_pages: object,
    ) -> Cover:
        """The destination fragments of the plain copy ``src_pages[i] -> dst_pages[i]`` (as
        :func:`~kvcr_policy.descriptors.build_descriptors` builds it; same page layout), each
        with the shift that carries its source bytes onto it."""
        same = (src.fragments_per_page, src.fragment_bytes) == (
            dst.fragments_per_page,
            dst.fragment_bytes,
        )
        fragments, position, order = _sorted_fragments(dst, dst_pages)
        source = check_pages(src, src_pages)
        if not same or len(source) != len(order):
            message = (
                f"pools {src.name!r} -> {dst.name!r}: expected one source page per destination "
                f"page ({len(order)}, got {len(source)}) and the same page layout"
            )
            raise PoolError(message)
        n = len(order)
        # Fragment f of page p starts at (f * pages + p) * fragment_bytes on either side.
        planes = np.arange(dst.fragments_per_page, dtype=np.int64)[:, None] * (
            src.pages - dst.pages
        )
        by_page = source[order] - fragments[:n]  # fragments[:n] are the sorted pages (plane 0)
        shift = (planes + by_page[None, :]) * dst.fragment_bytes
        return cls(dst.fragment_bytes, fragments, shift.ravel(), position, n, dst.nbytes)

    @property
    def nbytes(self) -> int:
        return len(self.fragments) * self.fragment_bytes

    def ranges(self) -> tuple[Int64Array, Int64Array]:
        """The plain ranges (offsets, lengths): one per fragment, in offset order."""
        fb = self.fragment_bytes
        return self.fragments * fb, np.full(len(self.fragments), fb, dtype=np.int64)

    def check(
        self,
        offsets: object,
        lengths: object,
        shifts: object = None,
        *,
        accepts: frozenset[str] = ANY_SHAPE,
        what: str,
        error: type[KVCRPolicyError] = ProtocolError,
    ) -> None:
        """Raise ``error`` unless the ranges ``offsets``/``lengths`` (with ``shifts``, when this
        cover has them) are exactly these fragments' bytes, each as often, in shapes
        ``accepts`` allows; see the module docstring."""
        off = _ints(offsets, what, "offsets", error)
        length = _ints(lengths, what, "lengths", error)
        n = len(off)
        zero = np.zeros(n, dtype=np.int64)
        shift = zero if shifts is None else _ints(shifts, what, "shifts", error)
        if len(length) != n or len(shift) != n:
            message = f"{what}: {n} offsets but {len(length)} lengths; expected pairs"
            raise error(message)
        if n > MAX_DESCRIPTORS:
            raise error(f"{what}: {n} descriptors exceed the limit of {MAX_DESCRIPTORS}")
        bad = (off < 0) | (off > self.limit) | (length < 1) | (length > self.limit)
        bad |= (shift > _HUGE) | (shift < -_HUGE)
        bad |= np.where(bad, 0, off) + np.where(bad, 0, length) > self.limit
        if bad.any():
            i = int(np.argmax(bad))
            message = (
                f"{what}: descriptor {i} (offset {int(off[i])}, {int(length[i])} bytes) is not "
                f"a range of at least one byte inside the {self.limit}-byte buffer"
            )
            raise error(message)
        fb = self.fragment_bytes
        ranges = _Ranges(off, length, shift, what, error)
        if len(self.fragments) > 1 and (self.fragments[1:] == self.fragments[:-1]).any():
            self._sweep(ranges)
        else:
            self._match(ranges)
        if accepts >= ANY_SHAPE:
            return
        first, last = off // fb, (off + length - 1) // fb
        for name, wrong in (
            ("coalesce", first != last),
            ("split", (off % fb != 0) | ((off + length) % fb != 0)),
        ):
            if name not in accepts and wrong.any():
                i = int(np.argmax(wrong))
                message = (
                    f"{what}: descriptor {i} (offset {int(off[i])}, {int(length[i])} bytes) "
                    f"needs '{name}', which this peer does not accept"
                )
                raise error(message)

    def _match(self, ranges: _Ranges) -> None:
        """The check for distinct pages: look each range's ends up among the fragments.

        Ranges are taken in offset order (lists arrive mostly sorted, and sorted lookups are
        several times faster), which is also the order the overlap test needs."""
        off, length, shift, what, error = ranges
        fb, fragments = self.fragment_bytes, self.fragments
        order = np.argsort(off, kind="stable")
        start, end = off[order], off[order] + length[order]
        first, last = start // fb, (end - 1) // fb
        lo = np.searchsorted(fragments, first, side="left")
        hi = np.searchsorted(fragments, last, side="right")
        inside = hi - lo == last - first + 1  # every fragment it touches is the request's
        if len(fragments):
            # Runs of consecutive fragments with one shift: a range inside one run maps as a
            # whole onto the plain list's bytes.
            step = np.ones(len(fragments), dtype=np.int64)
            step[1:] = (np.diff(fragments) != 1) | (np.diff(self.shift) != 0)
            run = np.cumsum(step)
            at = np.minimum(lo, len(fragments) - 1)
            to = np.clip(hi - 1, 0, len(fragments) - 1)
            inside &= (run[at] == run[to]) & (self.shift[at] == shift[order])
        if not inside.all():
            i = int(order[np.argmax(~inside)])
            message = (
                f"{what}: descriptor {i} (offset {int(off[i])}, {int(length[i])} bytes) covers "
                f"bytes outside the {self.count} pages of the request or moves them elsewhere; "
                "expected merges and cuts of the plain descriptors only"
            )
            raise error(message)
        overlap = start[1:] < end[:-1]
        if overlap.any():
            j = int(np.argmax(overlap))
            a, b = int(order[j]), int(order[j + 1])
            raise error(f"{what}: descriptors {a} and {b} overlap at byte {int(off[b])}")
        total = int(length.sum())
        if total != self.nbytes:
            message = (
                f"{what}: {len(off)} descriptors cover {total} of the {self.nbytes} bytes of the "
                f"{self.count} pages of the request; expected every byte exactly once"
            )
            raise error(message)

    def _sweep(self, ranges: _Ranges) -> None:
        """The check when a page is named twice: compare coverage counts per (shift, byte)."""
        off, length, shift, what, error = ranges
        fb = self.fragment_bytes
        plain = np.full(len(self.fragments), fb, dtype=np.int64)
        wrong = _first_difference(off, length, shift, self.fragments * fb, plain, self.shift)
        if wrong is not None:
            _, at, excess = wrong
            how = "outside the request or too often" if excess > 0 else "too rarely"
            message = (
                f"{what}: {len(off)} descriptors of {int(length.sum())} bytes do not cover "
                f"exactly the {self.count} pages ({self.nbytes} bytes) of the request: byte "
                f"{at} is covered {how}; expected each byte as often as the request names it"
            )
            raise error(message)

    def outcome(self, offsets: Int64Array, lengths: Int64Array, failed: np.ndarray) -> np.ndarray:
        """Per position: True unless a failed range touched one of its bytes (the ranges must
        have passed :meth:`check`)."""
        ok = np.ones(self.count, dtype=bool)
        if self.count == 0 or not failed.any():
            return ok
        fb = self.fragment_bytes
        off = offsets[failed]
        lo = np.searchsorted(self.fragments, off // fb, side="left")
        hi = np.searchsorted(self.fragments, (off + lengths[failed] - 1) // fb, side="right")
        marks = np.zeros(len(self.fragments) + 1, dtype=np.int64)
        np.add.at(marks, lo, 1)
        np.add.at(marks, hi, -1)
        ok[self.position[np.cumsum(marks[:-1]) > 0]] = False
        return ok
