"""Shaped descriptor lists: what they must cover, checked before a byte moves, and which pages
a failed message fails.

The client hands each batch's plain descriptors (one per page fragment, see
:func:`~kvcr_policy.descriptors.build_descriptors`) to its coalescing strategy and moves what
comes back, merged and cut in any way. A list is accepted only if it moves exactly the bytes of
the plain list:

- :func:`check_moves` (the client, which knows both sides): every byte goes from the same
  source byte to the same destination byte as in the plain list, as often: nothing outside the
  request's pages, nothing twice, nothing missed, nothing sent to another page.
- :meth:`Cover.check` (the server, which is told the tier side only): the tier ranges cover
  exactly the bytes of the slots it claimed or reserved for the request, and have only the
  shapes it accepts (``coalesce``: a range over several fragments; ``split``: part of one).

Both are one vectorised test. Two lists of byte ranges, each range tagged with a key (its shift
``dst - src`` for moves; 0 for one side), cover every (key, byte) equally often exactly when the
running sum of +1 at each start and -1 at each end of one list, and the opposite for the other,
taken in (key, offset) order, is zero after every offset. Lengths are checked first (at least
one byte, no offset or length past the buffer), so no sum can overflow.

:meth:`Cover.outcome` turns failed messages into failed pages from the bytes each message
covered (never from the ``page`` ranges a strategy returned): a page counts only if every
message that touched one of its bytes completed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kvcr_policy.descriptors import Descriptors
from kvcr_policy.errors import ProtocolError, TransportError
from kvcr_policy.geometry import PoolGeometry, fragment_offsets

from .payload import MAX_DESCRIPTORS

__all__ = ["Cover", "check_moves"]

Int64Array = npt.NDArray[np.int64]

#: Offsets and lengths above this are refused before any sum (no int64 overflow).
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


def _as_ranges(values: object, what: str, name: str) -> Int64Array:
    array = np.asarray(values)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        message = f"{what}: {name} must be a 1-D integer array, got {array.dtype} {array.shape}"
        raise ProtocolError(message)
    return array.astype(np.int64, copy=False)


def _check_bounds(offsets: Int64Array, lengths: Int64Array, limit: int, what: str) -> None:
    if len(offsets) != len(lengths):
        message = f"{what}: {len(offsets)} offsets but {len(lengths)} lengths; expected pairs"
        raise ProtocolError(message)
    if len(offsets) > MAX_DESCRIPTORS:
        message = f"{what}: {len(offsets)} descriptors exceed the limit of {MAX_DESCRIPTORS}"
        raise ProtocolError(message)
    bad = (offsets < 0) | (offsets > limit) | (lengths < 1) | (lengths > limit)
    ends = np.where(bad, 0, offsets) + np.where(bad, 0, lengths)  # in range: no overflow
    bad |= ends > limit
    if bad.any():
        i = int(np.argmax(bad))
        message = (
            f"{what}: descriptor {i} (offset {int(offsets[i])}, {int(lengths[i])} bytes) is "
            f"not a range of at least one byte inside the {limit}-byte buffer"
        )
        raise ProtocolError(message)


@dataclass(frozen=True, slots=True)
class Cover:
    """The bytes one side of one request may move: a range per (page, fragment) and the
    position of its page in the request. Ranges of two pages are equal (the same page twice)
    or disjoint; ``limit`` is the size of the buffer the offsets are relative to."""

    offset: Int64Array
    length: Int64Array
    position: Int64Array
    count: int
    limit: int

    @classmethod
    def of_pages(cls, geometry: PoolGeometry, pages: npt.ArrayLike) -> Cover:
        """Every fragment of ``pages`` (in range; checked) of a buffer laid out as ``geometry``."""
        offsets = fragment_offsets(geometry, pages)
        planes, n = offsets.shape
        return cls(
            offset=offsets.ravel(),
            length=np.full(planes * n, geometry.fragment_bytes, dtype=np.int64),
            position=np.tile(np.arange(n, dtype=np.int64), planes),
            count=n,
            limit=geometry.nbytes,
        )

    @classmethod
    def of_destinations(cls, plain: Descriptors, count: int, limit: int) -> Cover:
        """The destination side of plain descriptors (``page`` is the position)."""
        return cls(plain.dst, plain.length, plain.page, count, limit)

    @property
    def nbytes(self) -> int:
        return int(self.length.sum())

    def _ranges(self) -> tuple[Int64Array, Int64Array, Int64Array]:
        """Distinct ranges (sorted starts, ends) and the distinct index of every range."""
        starts, first, inverse = np.unique(self.offset, return_index=True, return_inverse=True)
        return starts, starts + self.length[first], inverse.reshape(-1)

    def check(
        self, offsets: object, lengths: object, *, accepts: frozenset[str], what: str
    ) -> None:
        """Raise ProtocolError unless ``offsets``/``lengths`` cover exactly these bytes (each as
        often as a plain list would) in shapes ``accepts`` allows; see the module docstring."""
        off = _as_ranges(offsets, what, "offsets")
        length = _as_ranges(lengths, what, "lengths")
        _check_bounds(off, length, self.limit, what)
        zero = np.zeros(len(off), dtype=np.int64)
        plain_zero = np.zeros(len(self.offset), dtype=np.int64)
        wrong = _first_difference(off, length, zero, self.offset, self.length, plain_zero)
        if wrong is not None:
            _, at, excess = wrong
            how = "outside the request or more than once" if excess > 0 else "never"
            message = (
                f"{what}: {len(off)} descriptors of {int(length.sum())} bytes do not cover "
                f"exactly the {self.count} slots ({self.nbytes} bytes) of the request: byte "
                f"{at} is covered {how}; expected every byte of those slots exactly once"
            )
            raise ProtocolError(message)
        if {"coalesce", "split"} <= accepts or len(off) == 0:
            return
        starts, ends, _ = self._ranges()
        first = np.searchsorted(starts, off, side="right") - 1
        last = np.searchsorted(starts, off + length - 1, side="right") - 1
        for name, bad in (
            ("coalesce", first != last),
            ("split", (off != starts[first]) | (off + length != ends[last])),
        ):
            if name not in accepts and bad.any():
                i = int(np.argmax(bad))
                message = (
                    f"{what}: descriptor {i} (offset {int(off[i])}, {int(length[i])} bytes) "
                    f"needs '{name}', which this peer does not accept"
                )
                raise ProtocolError(message)

    def outcome(self, offsets: Int64Array, lengths: Int64Array, failed: np.ndarray) -> np.ndarray:
        """Per position: True unless a failed descriptor touched one of its bytes.

        The descriptors must have passed :meth:`check` (or :func:`check_moves` for this side).
        """
        ok = np.ones(self.count, dtype=bool)
        if self.count == 0 or not failed.any():
            return ok
        starts, _, inverse = self._ranges()
        off = offsets[failed]
        first = np.searchsorted(starts, off, side="right") - 1
        last = np.searchsorted(starts, off + lengths[failed] - 1, side="right") - 1
        marks = np.zeros(len(starts) + 1, dtype=np.int64)
        np.add.at(marks, first, 1)
        np.add.at(marks, last + 1, -1)
        bad_range = np.cumsum(marks[:-1]) > 0
        ok[self.position[bad_range[inverse]]] = False
        return ok


def check_moves(plain: Descriptors, shaped: object, what: str) -> Descriptors:
    """``shaped`` if it moves exactly the bytes ``plain`` moves; else TransportError.

    Every byte must go from the same source byte to the same destination byte, as many times:
    merges and cuts of any kind pass, anything else (a gap, an overlap, a byte outside the
    request, a byte sent to another place) is refused before anything moves.
    """
    if not isinstance(shaped, Descriptors):
        got = type(shaped).__name__
        message = f"{what}: expected Descriptors from the coalescing strategy, got {got}"
        raise TransportError(message)
    if len(shaped) > MAX_DESCRIPTORS:
        message = (
            f"{what}: the coalescing strategy returned {len(shaped)} descriptors for one batch; "
            f"the peer protocol carries at most {MAX_DESCRIPTORS}: cut fewer pieces or lower "
            "batching.read_batch_pages"
        )
        raise TransportError(message)
    src, dst, length = shaped.src, shaped.dst, shaped.length
    bad = (src < 0) | (dst < 0) | (length < 1) | (src > _HUGE) | (dst > _HUGE)
    bad |= length > _HUGE
    if bad.any():
        i = int(np.argmax(bad))
        message = (
            f"{what}: descriptor {i} (src {int(src[i])}, dst {int(dst[i])}, {int(length[i])} "
            "bytes) is not a range of at least one byte at non-negative offsets"
        )
        raise TransportError(message)
    wrong = _first_difference(
        src, length, dst - src, plain.src, plain.length, plain.dst - plain.src
    )
    if wrong is not None:
        shift, at, excess = wrong
        how = "moved where the plain list does not move it" if excess > 0 else "not moved"
        message = (
            f"{what}: the coalescing strategy's {len(shaped)} descriptors do not move exactly "
            f"the bytes of the {len(plain)} plain ones: source byte {at} is {how} (to "
            f"destination byte {at + shift}); a strategy may only merge and cut descriptors"
        )
        raise TransportError(message)
    return shaped
