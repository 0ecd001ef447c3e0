"""Tests for kvcr_policy.geometry: shapes, byte counts, offsets against real buffers, refusals."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.errors import IndicesError, PoolError
from kvcr_policy.geometry import (
    LAYOUTS,
    MLA_LAYOUTS,
    BufferInfo,
    Layout,
    PoolGeometry,
    check_pages,
    fragment_offsets,
    page_indices,
    preset,
    validate_buffer,
)
from tests.strategies import geometries, page_lists

KIB = 1024
MIB = 1024 * KIB

ALL_KINDS = [(layout, False) for layout in LAYOUTS] + [(layout, True) for layout in MLA_LAYOUTS]


def make(layout: Layout = "layer_first", *, mla: bool = False, **changes: object) -> PoolGeometry:
    values: dict[str, object] = dict(
        name="kv",
        layout=layout,
        layers=3,
        heads=1 if mla else 2,
        head_dim=4,
        dtype="float32",
        page_size=2,
        tokens=10,
        mla=mla,
    )
    values.update(changes)
    return PoolGeometry(**values)  # type: ignore[arg-type]


def arange_buffer(geometry: PoolGeometry) -> np.ndarray:
    size = math.prod(geometry.shape)
    return np.arange(size, dtype=geometry.dtype).reshape(geometry.shape)


def fragment_views(buffer: np.ndarray, g: PoolGeometry, page: int) -> list[np.ndarray]:
    """The fragments of ``page`` in plane order, taken by plain numpy slicing of the layout."""
    tokens = slice(page * g.page_size, (page + 1) * g.page_size)
    halves = range(g.kv_halves)
    if g.mla:
        # No K/V axis: treat the buffer as one half.
        buffer = buffer[None]
    if g.layout == "layer_first":
        return [buffer[kv, layer, tokens] for kv in halves for layer in range(g.layers)]
    if g.layout == "page_first":
        return [buffer[kv, tokens] for kv in halves]
    return [buffer[kv, page] for kv in halves]  # page_first_direct, page_head


# --- shapes and sizes -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layout", "mla", "shape"),
    [
        ("layer_first", False, (2, 3, 10, 2, 4)),
        ("page_first", False, (2, 10, 3, 2, 4)),
        ("page_first_direct", False, (2, 5, 3, 2, 2, 4)),
        ("page_head", False, (2, 5, 2, 2, 3, 4)),
        ("layer_first", True, (3, 10, 1, 4)),
        ("page_first", True, (10, 3, 1, 4)),
        ("page_first_direct", True, (5, 3, 2, 1, 4)),
    ],
)
def test_shape_matches_sglang(layout: Layout, mla: bool, shape: tuple[int, ...]) -> None:
    g = make(layout, mla=mla)
    assert g.shape == shape
    assert g.nbytes == math.prod(shape) * g.itemsize
    assert g.pages * g.page_bytes == g.nbytes
    assert g.fragments_per_page * g.fragment_bytes == g.page_bytes


@pytest.mark.parametrize(("layout", "mla"), ALL_KINDS)
def test_fragments_per_page(layout: Layout, mla: bool) -> None:
    g = make(layout, mla=mla)
    halves = 1 if mla else 2
    assert g.kv_halves == halves
    assert g.fragments_per_page == (halves * g.layers if layout == "layer_first" else halves)


def test_qwen3_32b_layer_first_numbers() -> None:
    g = preset("qwen3-32b", layout="layer_first", tokens=64 * 4)
    assert g.token_bytes == 256 * KIB
    assert g.page_bytes == 16 * MIB
    assert g.fragments_per_page == 128
    assert g.fragment_bytes == 128 * KIB
    assert g.shape == (2, 64, 256, 8, 128)
    assert g.nbytes == 4 * 16 * MIB


def test_qwen3_32b_page_first_numbers() -> None:
    g = preset("qwen3-32b", layout="page_first", tokens=64)
    assert (g.fragments_per_page, g.fragment_bytes) == (2, 8 * MIB)


def test_seed_restore_bytes() -> None:
    # DESIGN.md: the seed's restore of 115,968 tokens is 30,400,315,392 bytes.
    g = preset("qwen3-32b", layout="layer_first", tokens=115_968)
    assert g.nbytes == 30_400_315_392


def test_small_preset_fragments() -> None:
    g = preset("small", layout="layer_first", tokens=16)
    assert g.fragment_bytes == 16 * KIB
    assert g.fragments_per_page == 32


def test_mla_preset_has_one_head() -> None:
    g = preset("small", layout="page_first", tokens=32, mla=True)
    assert (g.heads, g.kv_halves, g.shape) == (1, 1, (32, 16, 1, 64))


def test_unknown_preset_lists_presets() -> None:
    with pytest.raises(PoolError, match=r"'nope'.*qwen3-32b, small"):
        preset("nope", layout="layer_first", tokens=64)


# --- validation of the geometry itself ------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"layers": 0}, r"'layers': expected a positive int, got 0"),
        ({"heads": -1}, r"'heads': expected a positive int, got -1"),
        ({"head_dim": 2.0}, r"'head_dim': expected a positive int, got 2.0"),
        ({"page_size": True}, r"'page_size': expected a positive int, got True"),
        ({"tokens": 7}, r"'tokens': expected a multiple of page_size 2, got 7"),
        ({"layout": "page_unified"}, r"'layout': expected one of layer_first.*'page_unified'"),
        ({"dtype": "int4"}, r"'dtype': expected one of .*bfloat16.*got 'int4'"),
        ({"device": "tpu"}, r"'device': expected .*got 'tpu'"),
    ],
)
def test_invalid_geometry_names_field(changes: dict[str, object], pattern: str) -> None:
    with pytest.raises(PoolError, match=pattern) as info:
        make(**changes)  # type: ignore[arg-type]
    assert "pool 'kv'" in str(info.value)


def test_mla_needs_one_head() -> None:
    with pytest.raises(PoolError, match=r"'heads': expected 1 for an MLA pool.*got 2"):
        make("page_first", mla=True, heads=2)


def test_mla_has_no_page_head() -> None:
    with pytest.raises(PoolError, match=r"'layout'.*MLA.*got 'page_head'"):
        make("page_head", mla=True)


def test_with_tokens_keeps_layout_and_revalidates() -> None:
    g = make("page_head")
    tier = g.with_tokens(40)
    assert (tier.tokens, tier.pages, tier.layout, tier.fragment_bytes) == (
        40,
        20,
        g.layout,
        g.fragment_bytes,
    )
    with pytest.raises(PoolError, match="tokens"):
        g.with_tokens(41)


def test_digest_ignores_name_tokens_device() -> None:
    g = make("page_first")
    other = replace(g, name="tier", tokens=64, device="cuda")
    assert g.digest() == other.digest()
    assert len(g.digest()) == 16
    assert g.digest() != make("page_first_direct").digest()
    assert g.digest() != make("page_first", dtype="float16").digest()
    assert g.digest() != make("page_first", page_size=5).digest()


def test_digest_is_pinned() -> None:
    # Keys are namespaced by the digest: a change here orphans every stored key.
    g = preset("qwen3-32b", layout="layer_first", tokens=64)
    assert g.digest() == "70b9b73e717db0ba"


def test_field_order_is_pinned() -> None:
    assert list(PoolGeometry.__dataclass_fields__) == [
        "name",
        "layout",
        "layers",
        "heads",
        "head_dim",
        "dtype",
        "page_size",
        "tokens",
        "mla",
        "device",
    ]


# --- fragment offsets against real buffers ------------------------------------------------


def check_offsets_against_slicing(g: PoolGeometry, pages: list[int]) -> None:
    buffer = arange_buffer(g)
    flat = buffer.reshape(-1).view(np.uint8)
    base = buffer.__array_interface__["data"][0]
    offsets = fragment_offsets(g, np.asarray(pages, dtype=np.int64))
    assert offsets.shape == (g.fragments_per_page, len(pages))
    assert offsets.dtype == np.int64
    for i, page in enumerate(pages):
        views = fragment_views(buffer, g, page)
        assert len(views) == g.fragments_per_page
        for f, view in enumerate(views):
            assert view.flags.c_contiguous
            assert view.nbytes == g.fragment_bytes
            assert view.__array_interface__["data"][0] - base == offsets[f, i]
            got = flat[offsets[f, i] : offsets[f, i] + g.fragment_bytes]
            assert got.tobytes() == view.tobytes()


@pytest.mark.parametrize(("layout", "mla"), ALL_KINDS)
def test_fragment_offsets_match_slicing(layout: Layout, mla: bool) -> None:
    g = make(layout, mla=mla)
    check_offsets_against_slicing(g, [3, 0, 4, 1, 2])


@given(geometries(), st.data())
def test_fragment_offsets_match_slicing_any_geometry(g: PoolGeometry, data: st.DataObject) -> None:
    check_offsets_against_slicing(g, data.draw(page_lists(g.pages)))


@given(geometries())
def test_fragments_tile_the_buffer(g: PoolGeometry) -> None:
    offsets = fragment_offsets(g, np.arange(g.pages))
    assert np.array_equal(np.sort(offsets.ravel()), np.arange(0, g.nbytes, g.fragment_bytes))


@pytest.mark.parametrize(("layout", "mla"), ALL_KINDS)
def test_fragment_offsets_match_sglang_page_buffer_meta(layout: Layout, mla: bool) -> None:
    """The pointer formulas of SGLang 0.5.23's ``get_page_buffer_meta``, transcribed.

    MHA: pool_host/mha.py MHATokenToKVPoolHost; MLA: pool_host/mla.py MLATokenToKVPoolHost.
    ``index`` is the page's first token; offsets are relative to ``kv_buffer.data_ptr()``.
    """
    g = make(layout, mla=mla)
    isz, n_l, n_t, n_h, n_d = g.itemsize, g.layers, g.tokens, g.heads, g.head_dim
    v_offset = n_l * n_t * n_h * n_d * isz
    pages = [4, 1, 2]
    expected: list[int] = []
    for index in (p * g.page_size for p in pages):
        if layout == "layer_first":
            for layer_id in range(n_l):
                k_ptr = index * n_h * n_d * isz + layer_id * n_t * n_h * n_d * isz
                expected += [k_ptr] if mla else [k_ptr, k_ptr + v_offset]
        else:
            k_ptr = index * n_l * n_h * n_d * isz
            expected += [k_ptr] if mla else [k_ptr, k_ptr + v_offset]
    offsets = fragment_offsets(g, np.asarray(pages))
    # SGLang lists them page-major and K/V interleaved; the set is what must agree.
    assert sorted(expected) == sorted(offsets.ravel().tolist())


# --- buffers ------------------------------------------------------------------------------


def test_validate_numpy_buffer_returns_its_address() -> None:
    g = make("page_first")
    buffer = np.zeros(g.shape, dtype=np.float32)
    info = validate_buffer(g, buffer)
    assert info == BufferInfo(address=buffer.ctypes.data, nbytes=g.nbytes, device="cpu")


@pytest.mark.parametrize(("layout", "mla"), ALL_KINDS)
def test_validate_torch_buffer_returns_its_address(layout: Layout, mla: bool) -> None:
    g = make(layout, mla=mla, dtype="bfloat16")
    tensor = torch.zeros(g.shape, dtype=torch.bfloat16)
    info = validate_buffer(g, tensor)
    assert (info.address, info.nbytes, info.device) == (tensor.data_ptr(), g.nbytes, "cpu")


def test_validate_rejects_wrong_shape() -> None:
    g = make("layer_first")
    with pytest.raises(PoolError, match=r"pool 'kv'.*shape: expected \(2, 3, 10, 2, 4\), got"):
        validate_buffer(g, np.zeros((2, 3, 12, 2, 4), dtype=np.float32))


def test_validate_rejects_wrong_dtype() -> None:
    g = make("layer_first", dtype="bfloat16")
    with pytest.raises(PoolError, match=r"pool 'kv'.*dtype: expected bfloat16, got float16"):
        validate_buffer(g, torch.zeros(g.shape, dtype=torch.float16))
    with pytest.raises(PoolError, match=r"dtype: expected bfloat16, got uint8"):
        validate_buffer(g, np.zeros(g.shape, dtype=np.uint8))


def test_validate_rejects_non_contiguous() -> None:
    g = make("page_first")
    permuted = torch.zeros((2, 3, 10, 2, 4)).permute(0, 2, 1, 3, 4)
    assert tuple(permuted.shape) == g.shape
    with pytest.raises(PoolError, match=r"pool 'kv'.*strides: expected C-contiguous"):
        validate_buffer(g, permuted)
    strided = np.zeros((2, 20, 3, 2, 4), dtype=np.float32)[:, ::2]
    with pytest.raises(PoolError, match="strides"):
        validate_buffer(g, strided)


def test_validate_ignores_strides_of_size_one_axes() -> None:
    g = make("layer_first", mla=True)  # (3, 10, 1, 4)
    storage = torch.zeros(3 * 10 * 4)
    odd = storage.as_strided((3, 10, 1, 4), (40, 4, 12345, 1))
    assert validate_buffer(g, odd).address == storage.data_ptr()


def test_validate_rejects_wrong_device() -> None:
    g = make("page_first")
    with pytest.raises(PoolError, match=r"pool 'kv'.*device: expected cpu, got meta"):
        validate_buffer(g, torch.empty(g.shape, device="meta"))
    cuda = make("page_first", device="cuda:0")
    with pytest.raises(PoolError, match=r"device: expected cuda:0, got cpu"):
        validate_buffer(cuda, np.zeros(g.shape, dtype=np.float32))


def test_validate_rejects_other_types() -> None:
    with pytest.raises(
        PoolError, match=r"type: expected a torch.Tensor or numpy.ndarray, got list$"
    ):
        validate_buffer(make(), [0.0])


# --- indices ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "convert",
    [
        lambda a: torch.tensor(a, dtype=torch.int64),
        lambda a: np.asarray(a, dtype=np.int32),
        lambda a: np.asarray(a, dtype=np.uint64),
        list,
    ],
)
def test_page_indices_accepts_int_containers(convert: object) -> None:
    g = make(page_size=2, tokens=10)
    got = page_indices(g, convert([6, 7, 0, 1, 8, 9]))  # type: ignore[operator]
    assert got.dtype == np.int64
    assert got.tolist() == [3, 0, 4]


def test_page_indices_empty() -> None:
    assert page_indices(make(), []).tolist() == []
    assert page_indices(make(), torch.empty(0, dtype=torch.int64)).tolist() == []


@given(geometries(), st.data())
def test_page_indices_round_trip(g: PoolGeometry, data: st.DataObject) -> None:
    pages = np.asarray(data.draw(page_lists(g.pages)), dtype=np.int64)
    tokens = (pages[:, None] * g.page_size + np.arange(g.page_size)).ravel()
    assert page_indices(g, tokens).tolist() == pages.tolist()


@given(
    st.integers(1, 4),
    st.integers(1, 4),
    st.lists(st.integers(-3, 18), max_size=12),
)
def test_page_indices_accepts_exactly_whole_pages(size: int, pages: int, values: list[int]) -> None:
    """The fast acceptance and the explaining refusal agree with the rule, element by element:
    accepted iff every page is ``size`` consecutive tokens from an aligned first, all in range."""
    tokens = pages * size
    g = make(page_size=size, tokens=tokens)
    rows = [values[i : i + size] for i in range(0, len(values), size)]
    valid = len(values) % size == 0 and all(
        row == list(range(row[0], row[0] + size)) and row[0] % size == 0 and 0 <= row[0] < tokens
        for row in rows
    )
    if valid:
        assert page_indices(g, values).tolist() == [row[0] // size for row in rows]
    else:
        with pytest.raises(IndicesError):
            page_indices(g, values)


@pytest.mark.parametrize(
    ("indices", "pattern"),
    [
        (
            [2, 3, 1, 2],
            r"position 2 \(first of page 1\): expected a multiple of page_size 2, got 1",
        ),
        ([2, 3, 4, 6], r"position 3: expected 5 \(each page's tokens consecutive\), got 6"),
        ([2, 3, 5, 4], r"position 2 \(first of page 1\).*got 5"),
        ([0, 1, 10, 11], r"position 2: expected 0 <= index < 10, got 10"),
        ([-2, -1], r"position 0: expected 0 <= index < 10, got -2"),
        ([0, 1, 2], r"length: expected a multiple of page_size 2, got 3"),
        (np.asarray([0.0, 1.0]), r"dtype: expected an integer dtype, got float64"),
        (torch.tensor([0.0, 1.0]), r"dtype: expected an integer dtype, got float32"),
        (np.asarray([True, False]), r"dtype: expected an integer dtype, got bool"),
        (np.zeros((2, 2), dtype=np.int64), r"expected a 1-D array, got shape \(2, 2\)"),
        (np.asarray([2**63, 2**63 + 1], dtype=np.uint64), r"position 0: expected an int64"),
    ],
)
def test_page_indices_refusals(indices: object, pattern: str) -> None:
    with pytest.raises(IndicesError, match=pattern) as info:
        page_indices(make(page_size=2, tokens=10), indices)
    assert str(info.value).startswith("pool 'kv': ")


def test_check_pages() -> None:
    g = make(page_size=2, tokens=10)
    assert check_pages(g, [4, 0]).tolist() == [4, 0]
    with pytest.raises(IndicesError, match=r"position 1: expected 0 <= page < 5, got 5"):
        check_pages(g, [4, 5])
    with pytest.raises(IndicesError, match="integer dtype"):
        check_pages(g, [1.5])
    with pytest.raises(IndicesError, match="position 0"):
        fragment_offsets(g, [-1])
