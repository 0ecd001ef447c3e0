"""The host copy primitive: the native loop and the ctypes fallback copy exactly the same bytes."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcr_policy.backends import host_copy
from kvcr_policy.descriptors import Descriptors
from tests.strategies import copies

SIZE = 1 << 16


def run(native: bool, stream_from: int, d: Descriptors, src: np.ndarray) -> np.ndarray:
    out = np.zeros(SIZE, dtype=np.uint8)
    saved = host_copy._copy
    if not native:
        host_copy._copy = None
    try:
        host_copy.copy_descriptors(out.ctypes.data, src.ctypes.data, d, stream_from)
    finally:
        host_copy._copy = saved
    return out


@settings(max_examples=60, deadline=None)
@given(copies(SIZE), st.sampled_from([0, 1, 64, 1000, 1 << 20]))
def test_native_and_fallback_copy_the_same_bytes_as_numpy(
    case: tuple[list[int], list[int], list[int]], stream_from: int
) -> None:
    src_off, dst_off, lengths = case
    src = np.random.default_rng(len(lengths)).integers(0, 256, SIZE, dtype=np.uint8)
    expected = np.zeros(SIZE, dtype=np.uint8)
    for s, t, n in zip(src_off, dst_off, lengths, strict=True):
        expected[t : t + n] = src[s : s + n]
    d = Descriptors.from_arrays(src_off, dst_off, lengths)
    assert np.array_equal(run(False, stream_from, d, src), expected)
    if host_copy.NATIVE:
        assert np.array_equal(run(True, stream_from, d, src), expected)


@pytest.mark.skipif(not host_copy.NATIVE, reason="the native copy loop is not built here")
def test_overlapping_ranges_keep_memmove_semantics_even_when_streaming() -> None:
    buf = np.arange(4096, dtype=np.uint8)
    expected = buf.copy()
    expected[100:3100] = buf[0:3000].copy()
    d = Descriptors.from_arrays([0], [100], [3000])
    host_copy.copy_descriptors(buf.ctypes.data, buf.ctypes.data, d, 1)
    assert np.array_equal(buf, expected)


@pytest.mark.skipif(not host_copy.NATIVE, reason="the native copy loop is not built here")
def test_native_loop_refuses_mismatched_or_negative_descriptors() -> None:
    from kvcr_policy import _copy  # type: ignore[attr-defined]

    a = np.zeros(4, dtype=np.int64)
    with pytest.raises(ValueError, match="one length"):
        _copy.copy_many(0, 0, a, a[:3], a, 0)
    with pytest.raises(ValueError, match="negative"):
        _copy.copy_many(0, 0, a, a, np.array([1, 1, -1, 1], dtype=np.int64), 0)


def test_the_native_loop_is_built_wherever_a_c_compiler_is() -> None:
    """A silently failed build would only show as slower copies: catch it here."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the ctypes fallback is expected")
    assert host_copy.NATIVE, "kvcr_policy._copy did not build: reinstall with `pip install -e .`"
