"""The wire plan: both peers compute the same list; a failed message fails exactly its pages."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import page_transfers

from kvcr_policy.backends.peer.plan import page_outcome, wire_plan
from kvcr_policy.errors import TransportError


@given(page_transfers(), st.booleans(), st.sampled_from([0, 1, 3, 64]))
def test_read_and_write_plans_agree_and_cover_every_byte(t, merge: bool, split: int) -> None:
    src_pages, dst_pages = (
        np.asarray(t.src_pages, dtype=np.int64),
        np.asarray(t.dst_pages, dtype=np.int64),
    )
    server = wire_plan(t.src, src_pages, t.dst, dst_pages, merge=merge, split_bytes=split)
    client = wire_plan(
        replace(t.src, name="other"), src_pages, t.dst, dst_pages, merge=merge, split_bytes=split
    )
    client.check(server.count, server.nbytes, server.digest, "peer")
    assert server.nbytes == len(src_pages) * t.src.page_bytes
    if split:
        assert (server.descriptors.length <= split).all()


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
