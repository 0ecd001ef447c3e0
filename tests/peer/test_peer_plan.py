"""The wire plan: it moves exactly the pages' bytes, its digest catches any disagreement
between the peers, and a failed message fails exactly its pages."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.backends.peer.plan import WirePlan, page_outcome, wire_plan
from kvcr_policy.errors import TransportError
from tests.strategies import PageTransfer, page_slice, page_transfers


def run(plan: WirePlan, t: PageTransfer) -> tuple[np.ndarray, np.ndarray]:
    """Carry out ``plan`` between a source whose every byte holds its own number and an empty
    destination; returns (the destination, how often each of its bytes was written)."""
    src = np.arange(math.prod(t.src.shape), dtype=np.int64).reshape(t.src.shape)
    src_bytes = np.repeat(src.reshape(-1) * ITEMSIZE, ITEMSIZE) + np.tile(
        np.arange(ITEMSIZE), src.size
    )
    dst = np.full(math.prod(t.dst.shape) * ITEMSIZE, -1, dtype=np.int64)
    writes = np.zeros(dst.size, dtype=np.int64)
    d = plan.descriptors
    for s, o, n in zip(d.src.tolist(), d.dst.tolist(), d.length.tolist(), strict=True):
        dst[o : o + n] = src_bytes[s : s + n]
        writes[o : o + n] += 1
    return dst, writes


ITEMSIZE = 2  # every geometry below is float16: whole elements are 2 bytes


@given(page_transfers(), st.booleans(), st.sampled_from([0, 1, 3, 64]))
def test_the_plan_moves_every_page_byte_once_to_its_page(t, merge: bool, split: int) -> None:
    """Checked against the buffers' own indexing (``page_slice``), not the descriptor code."""
    t = replace(t, src=replace(t.src, dtype="float16"), dst=replace(t.dst, dtype="float16"))
    src_pages = np.asarray(t.src_pages, dtype=np.int64)
    dst_pages = np.asarray(t.dst_pages, dtype=np.int64)
    plan = wire_plan(t.src, src_pages, t.dst, dst_pages, merge=merge, split_bytes=split)
    assert plan.nbytes == len(src_pages) * t.src.page_bytes
    if split:
        assert (plan.descriptors.length <= split).all()
    dst, writes = run(plan, t)
    dst_elements = np.arange(math.prod(t.dst.shape)).reshape(t.dst.shape)
    src_elements = np.arange(math.prod(t.src.shape)).reshape(t.src.shape)
    expected_writes = np.zeros_like(writes)
    for a, b in zip(t.src_pages, t.dst_pages, strict=True):
        into = dst_elements[page_slice(t.dst, b)].reshape(-1)
        came = src_elements[page_slice(t.src, a)].reshape(-1)
        for k in range(ITEMSIZE):
            assert np.array_equal(dst[into * ITEMSIZE + k], came * ITEMSIZE + k)
            expected_writes[into * ITEMSIZE + k] += 1
    assert np.array_equal(writes, expected_writes), "a byte outside the pages, or written twice"


@given(page_transfers(), st.data())
def test_the_digest_tells_plans_apart_exactly_when_their_descriptors_differ(
    t: PageTransfer, data: st.DataObject
) -> None:
    """Both peers compare digests before any byte moves: two plans pass the check exactly when
    their descriptor lists are equal (other merge, split or page order: refused)."""
    src_pages = np.asarray(t.src_pages, dtype=np.int64)

    def plan() -> WirePlan:
        order = data.draw(st.permutations(range(len(t.dst_pages))))
        return wire_plan(
            t.src,
            src_pages,
            t.dst,
            np.asarray(t.dst_pages, dtype=np.int64)[list(order)],
            merge=data.draw(st.booleans()),
            split_bytes=data.draw(st.sampled_from([0, 1, 3, 64])),
        )

    ours, theirs = plan(), plan()
    a, b = ours.descriptors, theirs.descriptors
    same = all(
        np.array_equal(getattr(a, name), getattr(b, name)) for name in ("src", "dst", "length")
    )
    if same:
        ours.check(theirs.count, theirs.nbytes, theirs.digest, "the peer")
    else:
        with pytest.raises(TransportError, match="disagree"):
            ours.check(theirs.count, theirs.nbytes, theirs.digest, "the peer")


def test_a_different_plan_is_refused() -> None:
    from kvcr_policy.geometry import preset

    geo = preset("small", layout="layer_first", tokens=64)
    pages = np.arange(4)
    merged = wire_plan(geo, pages, geo, pages, merge=True, split_bytes=0)
    plain = wire_plan(geo, pages, geo, pages, merge=False, split_bytes=0)
    with pytest.raises(TransportError, match="disagree"):
        merged.check(plain.count, plain.nbytes, plain.digest, "the peer")


@given(page_transfers(), st.booleans(), st.data())
def test_a_failed_descriptor_fails_every_page_it_touches_and_no_other(t, merge, data) -> None:
    plan = wire_plan(
        t.src,
        np.asarray(t.src_pages, dtype=np.int64),
        t.dst,
        np.asarray(t.dst_pages, dtype=np.int64),
        merge=merge,
        split_bytes=0,
    )
    d, n = plan.descriptors, len(t.src_pages)
    failed = np.asarray(
        data.draw(st.lists(st.booleans(), min_size=len(d), max_size=len(d))), dtype=bool
    )
    ok = page_outcome(d, failed, n)
    touched = np.zeros(n, dtype=bool)
    for i in np.flatnonzero(failed):
        touched[d.page[i] : d.page_end[i]] = True
    assert np.array_equal(ok, ~touched)
