"""Shaped descriptor lists: any merge and cut passes; a gap, overlap, stray byte, misrouted
byte or count mismatch is refused before anything moves; a failure fails exactly its pages."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from kvcr_policy.backends.peer.wire.coverage import Cover
from kvcr_policy.backends.peer.wire.payload import MAX_DESCRIPTORS
from kvcr_policy.descriptors import Descriptors, build_descriptors, coalesce, split
from kvcr_policy.errors import ProtocolError
from kvcr_policy.errors import TransportError as TE
from kvcr_policy.geometry import preset
from tests.strategies import (
    geometries,
    page_transfers,
    repeating_transfers,
    reshaped,
    tier_slots,
)

ANY = frozenset({"coalesce", "split"})


def _tier_side(cover: Cover) -> Descriptors:
    """The plain list of the tier side alone (src = dst = tier offset)."""
    offsets, lengths = cover.ranges()
    return Descriptors.from_arrays(offsets, offsets, lengths, page=cover.position)


def _counts(nbytes: int, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    counts = np.zeros(nbytes, dtype=np.int64)
    for offset, length in zip(offsets.tolist(), lengths.tolist(), strict=True):
        counts[offset : offset + length] += 1
    return counts


def _refused(cover: Cover, offsets: np.ndarray, lengths: np.ndarray, accepts=ANY) -> bool:
    try:
        cover.check(offsets, lengths, accepts=accepts, what="test")
    except ProtocolError:
        return True
    return False


@given(geometries(), st.booleans(), st.data())
def test_any_merge_and_cut_of_the_claimed_slots_is_accepted(geo, repeats, data) -> None:
    cover = Cover.of_pages(geo, data.draw(tier_slots(geo, repeats=repeats)))
    shaped = data.draw(reshaped(_tier_side(cover), by_src=True))
    assert not _refused(cover, shaped.src, shaped.length)


@given(geometries(), st.booleans(), st.data())
def test_a_gap_an_overlap_a_stray_byte_or_a_count_mismatch_is_refused(geo, repeats, data) -> None:
    cover = Cover.of_pages(geo, data.draw(tier_slots(geo, repeats=repeats)))
    shaped = data.draw(reshaped(_tier_side(cover), by_src=True))
    offsets, lengths = shaped.src.copy(), shaped.length.copy()
    i = data.draw(st.integers(0, len(offsets) - 1))
    kind = data.draw(st.sampled_from(["drop", "shrink", "grow", "shift", "stray", "count"]))
    if kind == "drop":  # a gap
        offsets, lengths = np.delete(offsets, i), np.delete(lengths, i)
    elif kind == "shrink":  # a gap (or a zero-length descriptor)
        lengths[i] -= data.draw(st.integers(1, int(lengths[i])))
    elif kind == "grow":  # an overlap or a byte past the slots
        lengths[i] += data.draw(st.integers(1, 64))
    elif kind == "shift":  # a gap and a stray range
        offsets[i] += data.draw(st.integers(-64, 64).filter(bool))
    elif kind == "stray":  # one byte anywhere in the tier, once more
        offsets = np.append(offsets, data.draw(st.integers(0, geo.nbytes - 1)))
        lengths = np.append(lengths, 1)
    else:  # offsets and lengths do not pair up
        lengths = np.append(lengths, 1)
    assert _refused(cover, offsets, lengths)


@given(geometries(max_pages=4), st.data())
def test_the_check_agrees_with_counting_every_byte(geo, data) -> None:
    cover = Cover.of_pages(geo, data.draw(tier_slots(geo, repeats=True)))
    if data.draw(st.booleans()):
        shaped = data.draw(reshaped(_tier_side(cover), by_src=True))
        offsets, lengths = shaped.src, shaped.length
        if data.draw(st.booleans()) and len(offsets):
            i = data.draw(st.integers(0, len(offsets) - 1))
            lengths = lengths.copy()
            lengths[i] += data.draw(st.integers(-2, 2))
    else:
        n = data.draw(st.integers(0, 8))
        pair = st.tuples(st.integers(-2, geo.nbytes + 2), st.integers(-1, geo.nbytes + 1))
        rows = np.asarray(data.draw(st.lists(pair, min_size=n, max_size=n)), dtype=np.int64)
        offsets, lengths = rows.reshape(-1, 2)[:, 0], rows.reshape(-1, 2)[:, 1]
    valid = bool(((offsets >= 0) & (lengths >= 1) & (offsets + lengths <= geo.nbytes)).all())
    same = valid and np.array_equal(
        _counts(geo.nbytes, offsets, lengths), _counts(geo.nbytes, *cover.ranges())
    )
    assert _refused(cover, offsets, lengths) == (not same)


@given(geometries(), st.sets(st.sampled_from(sorted(ANY))), st.data())
def test_shapes_the_peer_does_not_accept_are_refused(geo, accepts, data) -> None:
    cover = Cover.of_pages(geo, data.draw(tier_slots(geo, repeats=False)))
    shaped = data.draw(reshaped(_tier_side(cover), by_src=True))
    starts, lengths = cover.ranges()
    ends = starts + lengths
    merged = cut = False
    for offset, length in zip(shaped.src.tolist(), shaped.length.tolist(), strict=True):
        touched = np.flatnonzero((starts < offset + length) & (ends > offset))
        merged |= len(touched) > 1
        cut |= offset != starts[touched].min() or offset + length != ends[touched].max()
    wrong = (merged and "coalesce" not in accepts) or (cut and "split" not in accepts)
    assert _refused(cover, shaped.src, shaped.length, frozenset(accepts)) == wrong


@given(geometries(), st.booleans(), st.data())
def test_a_failed_message_fails_exactly_the_pages_it_touched(geo, repeats, data) -> None:
    cover = Cover.of_pages(geo, data.draw(tier_slots(geo, repeats=repeats)))
    shaped = data.draw(reshaped(_tier_side(cover), by_src=True))
    failed = np.asarray(
        data.draw(st.lists(st.booleans(), min_size=len(shaped), max_size=len(shaped))), dtype=bool
    )
    ok = cover.outcome(shaped.src, shaped.length, failed)
    bad_bytes = _counts(geo.nbytes, shaped.src[failed], shaped.length[failed]) > 0
    expected = np.ones(cover.count, dtype=bool)
    offsets, lengths = cover.ranges()
    for offset, length, position in zip(
        offsets.tolist(), lengths.tolist(), cover.position.tolist(), strict=True
    ):
        if bad_bytes[offset : offset + length].any():
            expected[position] = False
    assert np.array_equal(ok, expected)


def test_descriptor_counts_are_bounded() -> None:
    tier = preset("small", layout="layer_first", tokens=64)
    cover = Cover.of_pages(tier, [0])
    ones = np.ones(MAX_DESCRIPTORS + 1, dtype=np.int64)
    with pytest.raises(ProtocolError, match="exceed the limit"):
        cover.check(np.arange(len(ones)), ones, accepts=ANY, what="SEND 1")


def _moves_refused(t: Any, shaped: Descriptors) -> bool:
    cover = Cover.of_moves(t.src, t.src_pages, t.dst, t.dst_pages)
    try:
        cover.check(shaped.dst, shaped.length, shaped.src - shaped.dst, what="t", error=TE)
    except TE:
        return True
    return False


@given(page_transfers(), st.data())
def test_any_merge_and_cut_moves_the_same_bytes(t, data) -> None:
    plain = build_descriptors(t.src, t.src_pages, t.dst, t.dst_pages)
    assert not _moves_refused(t, plain)
    assert not _moves_refused(t, split(coalesce(plain), 3))
    assert not _moves_refused(t, data.draw(reshaped(plain)))


@given(page_transfers(), st.data())
def test_a_misrouted_missing_or_extra_byte_is_refused(t, data) -> None:
    plain = build_descriptors(t.src, t.src_pages, t.dst, t.dst_pages)
    assume(len(plain) > 0)
    shaped = data.draw(reshaped(plain))
    src, dst, length = shaped.src.copy(), shaped.dst.copy(), shaped.length.copy()
    i = data.draw(st.integers(0, len(src) - 1))
    kinds = ["dst", "src", "swap", "drop", "extra", "shorter", "joined"]
    kind = data.draw(st.sampled_from(kinds))
    if kind == "joined":  # two ranges adjacent at the destination only, moved as one
        at = {int(d): k for k, d in enumerate(dst.tolist())}
        pairs = [
            (k, at[int(d + n)])
            for k, (d, n) in enumerate(zip(dst.tolist(), length.tolist(), strict=True))
            if int(d + n) in at and src[k] + n != src[at[int(d + n)]]
        ]
        assume(pairs)
        k, j = data.draw(st.sampled_from(pairs))
        length[k] += length[j]
        src, dst, length = np.delete(src, j), np.delete(dst, j), np.delete(length, j)
    elif kind == "dst":  # right source, wrong destination
        dst[i] += data.draw(st.integers(-8, 8).filter(bool))
    elif kind == "src":  # right destination, wrong source
        src[i] += data.draw(st.integers(-8, 8).filter(bool))
    elif kind == "swap":  # two descriptors' destinations exchanged
        j = data.draw(st.integers(0, len(src) - 1))
        assume(dst[i] != dst[j] and src[i] - dst[i] != src[j] - dst[j])
        dst[i], dst[j] = dst[j], dst[i]
    elif kind == "drop":
        src, dst, length = np.delete(src, i), np.delete(dst, i), np.delete(length, i)
    elif kind == "extra":
        src, dst, length = np.append(src, src[i]), np.append(dst, dst[i]), np.append(length, 1)
    else:
        length[i] -= 1
    assert _moves_refused(t, Descriptors.from_arrays(src, dst, length))


def _byte_moves(src: np.ndarray, dst: np.ndarray, length: np.ndarray) -> Counter[tuple[int, int]]:
    moves: Counter[tuple[int, int]] = Counter()
    for s, d, n in zip(src.tolist(), dst.tolist(), length.tolist(), strict=True):
        moves.update((s + k, d + k) for k in range(n))
    return moves


@given(repeating_transfers(), st.data())
def test_the_client_check_agrees_with_listing_every_byte_move(t, data) -> None:
    plain = build_descriptors(t.src, t.src_pages, t.dst, t.dst_pages)
    shaped = data.draw(reshaped(plain))
    src, dst, length = shaped.src.copy(), shaped.dst.copy(), shaped.length.copy()
    if len(src) and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(src) - 1))
        which = data.draw(st.sampled_from([src, dst, length]))
        which[i] += data.draw(st.integers(-3, 3))
    valid = bool(
        ((src >= 0) & (dst >= 0) & (length >= 1)).all()
        and ((src + length <= t.src.nbytes) & (dst + length <= t.dst.nbytes)).all()
    )
    same = valid and _byte_moves(src, dst, length) == _byte_moves(
        plain.src, plain.dst, plain.length
    )
    assert _moves_refused(t, Descriptors.from_arrays(src, dst, length)) == (not same)


def test_the_client_refuses_a_descriptor_whose_end_would_wrap_in_int64() -> None:
    """offset + length past 2**63 wraps negative; the check compares the room left instead
    (refused before any connection is touched: none is given)."""
    from kvcr_policy.backends.peer.client.ops import _post

    view = np.zeros(64, dtype=np.uint8)
    for offset, length in (((1 << 63) - 8, 16), (8, (1 << 63) - 4), (-8, 8)):
        offsets, lengths = np.array([offset], np.int64), np.array([length], np.int64)
        with pytest.raises(TE, match="falls outside the pool"):
            _post(None, offsets, lengths, view, True, 0, lambda failed: None)  # type: ignore[arg-type]
