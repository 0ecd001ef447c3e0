"""Moves between the page cache and the pool on real files: what a write puts in a slot reads
back, a read cut short anywhere (end of file, or a non-blocking read that stops) settles
exactly the pages it read whole, and a page failing its checksum is zeroed in the pool."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcr_policy.backends.file.directory import stride_of
from kvcr_policy.backends.file.inplace import PoolSide, pool_view, read_in_place, write_in_place
from kvcr_policy.geometry import PoolGeometry, fragment_offsets
from tests.support.pools import geometry

LAYOUTS = ["layer_first", "page_first", "page_head"]


def _pool(geo: PoolGeometry, seed: int) -> tuple[np.ndarray, PoolSide]:
    pool = np.random.default_rng(seed).integers(0, 256, geo.nbytes, dtype=np.uint8)
    address = int(pool.ctypes.data)
    return pool, PoolSide(address, geo, pool_view(address, geo.nbytes))


def _page(pool: np.ndarray, geo: PoolGeometry, page: int) -> bytes:
    offsets = fragment_offsets(geo, [page])[:, 0]
    return b"".join(pool[o : o + geo.fragment_bytes].tobytes() for o in offsets)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    layout=st.sampled_from(LAYOUTS),
    padded=st.booleans(),
    count=st.integers(1, 6),
    first=st.integers(0, 3),
    chunk=st.sampled_from([1, 700, 5000, 1 << 20]),
    cut=st.floats(0, 1.2),
    nowait=st.booleans(),
)
def test_a_read_cut_short_settles_exactly_the_pages_it_read_whole(
    tmp_path: Path,
    layout: str,
    padded: bool,
    count: int,
    first: int,
    chunk: int,
    cut: float,
    nowait: bool,
) -> None:
    # 384-byte pages in 4 KiB slots (padding), or 8 KiB pages filling their slots.
    sizes = (
        {"layers": 3, "head_dim": 8, "page_size": 2} if padded else {"layers": 4, "head_dim": 64}
    )
    geo = geometry(layout, pages=2 * count, **sizes)  # type: ignore[arg-type]
    stride = stride_of(geo.page_bytes)
    src, src_side = _pool(geo, 1)
    dst, dst_side = _pool(geo, 2)
    path = tmp_path / f"slots-{layout}-{padded}-{count}-{first}-{chunk}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        crcs = write_in_place(fd, stride, src_side, first, np.arange(count), chunk_bytes=chunk)
        end = int((first + count) * stride * cut)
        os.ftruncate(fd, min(end, (first + count) * stride))
        ok = np.zeros(count, dtype=bool)
        targets = np.arange(count, 2 * count)
        settled = read_in_place(fd, stride, dst_side, first, targets, crcs, ok, nowait, chunk)
    finally:
        os.close(fd)
        path.unlink()
    size = min(end, (first + count) * stride)
    whole = [(first + j + 1) * stride <= size for j in range(count)]
    data = [(first + j) * stride + geo.page_bytes <= size for j in range(count)]
    if nowait:  # stops at the first page not read whole; the caller reads the rest
        assert whole[:settled] == [True] * settled
        assert settled == count or not whole[settled]
    else:
        assert settled == count
    for j in range(count):
        if ok[j]:
            assert j < settled and data[j]
            assert _page(dst, geo, count + j) == _page(src, geo, j)
        elif j < settled:
            assert not whole[j]  # a page read whole from an intact file passes its check


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_page_failing_its_checksum_is_zeroed_in_the_pool(tmp_path: Path, layout: str) -> None:
    geo = geometry(layout, pages=4, layers=4, head_dim=64)
    stride = stride_of(geo.page_bytes)
    src, side = _pool(geo, 3)
    fd = os.open(tmp_path / "slots", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        crcs = write_in_place(fd, stride, side, 0, np.arange(2))
        os.pwrite(fd, b"\xff", stride + 17)  # page 1's bytes change after its checksum
        ok = np.zeros(2, dtype=bool)
        assert read_in_place(fd, stride, side, 0, np.array([2, 3]), crcs, ok) == 2
    finally:
        os.close(fd)
    assert ok.tolist() == [True, False]
    assert _page(src, geo, 2) == _page(src, geo, 0)
    assert not any(_page(src, geo, 3))
