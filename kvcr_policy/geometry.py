"""Pool geometry: the byte layout of an engine's host KV pool, and per-pool validation.

A :class:`PoolGeometry` says where every byte of a KV page lives in a pool buffer, so that a
transfer can be planned as arrays of byte offsets (see :mod:`kvcr_policy.descriptors`) without
touching the tensor. The buffer shapes mirror SGLang 0.5.23 (checked against the wheel's source;
internals move between versions, so the version is pinned). ``T`` tokens, ``P`` page size,
``L`` layers, ``H`` heads, ``D`` head dim::

    MHA  sglang/srt/mem_cache/pool_host/mha.py, MHATokenToKVPoolHost.init_kv_buffer
         layer_first        (2, L, T, H, D)
         page_first         (2, T, L, H, D)
         page_first_direct  (2, T/P, L, P, H, D)
         page_head          (2, T/P, H, P, L, D)
    MLA  sglang/srt/mem_cache/pool_host/mla.py, MLATokenToKVPoolHost.init_kv_buffer
         layer_first        (L, T, 1, D_kv)
         page_first         (T, L, 1, D_kv)
         page_first_direct  (T/P, L, P, 1, D_kv)
         page_head          not supported ("Unsupported layout" ValueError)

(``sglang/srt/mem_cache/memory_pool_host.py`` no longer holds these classes in 0.5.23.) The
``get_page_buffer_meta`` methods of the same two classes give the contiguous pieces of a page:
MHA ``layer_first`` two per layer (K, V) of ``P·H·D`` elements; MHA ``page_first``,
``page_first_direct`` and ``page_head`` two (K, V) of ``L·P·H·D`` elements each (for
``page_head`` the page's ``[H, P, L, D]`` block is contiguous); MLA ``layer_first`` one per layer,
MLA page-first layouts one per page. Not modelled: ``page_unified``, the NPU-only
``page_first_kv_split`` and the MHA host pool whose V head dim differs from K's.

Every supported layout has the same shape in bytes, which is what makes the offsets one outer
sum: the buffer is ``fragments_per_page`` *planes* in memory order (K then V; within each, layer
by layer in ``layer_first``), and each plane is ``pages`` contiguous fragments of
``fragment_bytes``. So fragment ``f`` of page ``p`` starts at
``f · plane_bytes + p · fragment_bytes``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NoReturn, get_args

import numpy as np
import numpy.typing as npt

from kvcr_policy.errors import IndicesError, PoolError
from kvcr_policy.memory import linux as _os

__all__ = [
    "DTYPE_ITEMSIZE",
    "LAYOUTS",
    "MLA_LAYOUTS",
    "PRESETS",
    "BufferInfo",
    "Layout",
    "PoolGeometry",
    "check_pages",
    "check_unchanged",
    "fragment_offsets",
    "key_pages",
    "opaque",
    "page_indices",
    "preset",
    "validate_buffer",
]

Layout = Literal["layer_first", "page_first", "page_first_direct", "page_head"]
LAYOUTS: Final[tuple[Layout, ...]] = get_args(Layout)
# MLATokenToKVPoolHost.init_kv_buffer has no page_head branch in SGLang 0.5.23.
MLA_LAYOUTS: Final[tuple[Layout, ...]] = ("layer_first", "page_first", "page_first_direct")

# Names as torch spells them (``str(torch.bfloat16)`` without the ``torch.`` prefix); numpy's
# ``dtype.name`` agrees for the types numpy has.
DTYPE_ITEMSIZE: Final[Mapping[str, int]] = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
}

PRESETS: Final[Mapping[str, Mapping[str, Any]]] = {
    "qwen3-32b": dict(layers=64, heads=8, head_dim=128, dtype="bfloat16", page_size=64),
    "small": dict(layers=16, heads=8, head_dim=64, dtype="bfloat16", page_size=16),
}

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class PoolGeometry:
    """The geometry of one KV pool buffer: layout, model dimensions, dtype, pages, device.

    ``tokens`` is the pool's token capacity (SGLang's host ``size``), a multiple of
    ``page_size``. For MLA, ``heads`` is 1 and ``head_dim`` is the latent width ``D_kv``.
    """

    name: str
    layout: Layout
    layers: int
    heads: int
    head_dim: int
    dtype: str
    page_size: int
    tokens: int
    mla: bool = False
    device: str = "cpu"

    def __post_init__(self) -> None:
        for field in ("layers", "heads", "head_dim", "page_size", "tokens"):
            value = getattr(self, field)
            # bool is an int subclass; True layers is a bug, not 1 layer.
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                self._refuse(field, "a positive int", repr(value))
        if self.layout not in LAYOUTS:
            self._refuse("layout", f"one of {', '.join(LAYOUTS)}", repr(self.layout))
        if self.dtype not in DTYPE_ITEMSIZE:
            self._refuse("dtype", f"one of {', '.join(DTYPE_ITEMSIZE)}", repr(self.dtype))
        if self.tokens % self.page_size:
            self._refuse(
                "tokens",
                f"a multiple of page_size {self.page_size}",
                f"{self.tokens} (remainder {self.tokens % self.page_size})",
            )
        if self.mla and self.heads != 1:
            self._refuse("heads", "1 for an MLA pool (one latent head)", str(self.heads))
        if self.mla and self.layout not in MLA_LAYOUTS:
            self._refuse(
                "layout",
                f"one of {', '.join(MLA_LAYOUTS)} for an MLA pool (SGLang has no MLA page_head)",
                repr(self.layout),
            )
        if not self.device.startswith(("cpu", "cuda")):
            self._refuse("device", "'cpu', 'cuda' or 'cuda:N'", repr(self.device))

    def _refuse(self, field: str, expected: str, got: str) -> NoReturn:
        message = f"pool {self.name!r}: geometry field {field!r}: expected {expected}, got {got}"
        raise PoolError(message)

    @property
    def itemsize(self) -> int:
        """Bytes per element of ``dtype``."""
        return DTYPE_ITEMSIZE[self.dtype]

    @property
    def kv_halves(self) -> int:
        """2 (K and V) for MHA, 1 for MLA (one latent per token)."""
        return 1 if self.mla else 2

    @property
    def pages(self) -> int:
        """Number of pages the pool holds."""
        return self.tokens // self.page_size

    @property
    def token_bytes(self) -> int:
        """Bytes of one token over all layers, K and V."""
        return self.kv_halves * self.layers * self.heads * self.head_dim * self.itemsize

    @property
    def page_bytes(self) -> int:
        """Bytes of one page over all layers, K and V."""
        return self.token_bytes * self.page_size

    @property
    def fragments_per_page(self) -> int:
        """Contiguous pieces of a page: ``kv_halves·L`` in ``layer_first``, else ``kv_halves``."""
        if self.layout == "layer_first":
            return self.kv_halves * self.layers
        return self.kv_halves

    @property
    def fragment_bytes(self) -> int:
        """Bytes of one contiguous fragment of a page."""
        return self.page_bytes // self.fragments_per_page

    @property
    def plane_bytes(self) -> int:
        """Bytes of one fragment plane: the same fragment of every page, back to back."""
        return self.pages * self.fragment_bytes

    @property
    def nbytes(self) -> int:
        """Bytes of the whole buffer."""
        return self.tokens * self.token_bytes

    @property
    def shape(self) -> tuple[int, ...]:
        """The buffer shape SGLang 0.5.23 allocates for this layout (see the module docstring)."""
        n_l, n_t, n_h, n_d = self.layers, self.tokens, self.heads, self.head_dim
        n_p, n_pages = self.page_size, self.pages
        if self.mla:
            mla_shapes: dict[str, tuple[int, ...]] = {
                "layer_first": (n_l, n_t, 1, n_d),
                "page_first": (n_t, n_l, 1, n_d),
                "page_first_direct": (n_pages, n_l, n_p, 1, n_d),
            }
            return mla_shapes[self.layout]
        mha_shapes: dict[str, tuple[int, ...]] = {
            "layer_first": (2, n_l, n_t, n_h, n_d),
            "page_first": (2, n_t, n_l, n_h, n_d),
            "page_first_direct": (2, n_pages, n_l, n_p, n_h, n_d),
            "page_head": (2, n_pages, n_h, n_p, n_l, n_d),
        }
        return mha_shapes[self.layout]

    def with_tokens(self, tokens: int) -> PoolGeometry:
        """A copy with another token count (a tier mirrors the pool's layout with its slots)."""
        return dataclasses.replace(self, tokens=tokens)

    def tier(self, name: str, slots: int) -> PoolGeometry:
        """A host tier of ``slots`` pages laid out as this pool, named ``name``, on the CPU."""
        return dataclasses.replace(self, name=name, tokens=slots * self.page_size, device="cpu")

    def digest(self) -> str:
        """A short stable hex digest of the byte layout; name, tokens and device excluded.

        Two pools with equal digests store a page as identical bytes, so keys namespaced by the
        digest can be shared between them.
        """
        canon = (
            f"kvcr-geometry-v1;layout={self.layout};layers={self.layers};heads={self.heads};"
            f"head_dim={self.head_dim};dtype={self.dtype};page_size={self.page_size};"
            f"mla={int(self.mla)}"
        )
        return hashlib.sha256(canon.encode()).hexdigest()[:16]


def preset(
    name: str, *, layout: Layout, tokens: int, mla: bool = False, device: str = "cpu"
) -> PoolGeometry:
    """The geometry of a named preset; the preset name becomes the pool name.

    With ``mla=True`` the preset keeps its layers, head dim, dtype and page size and uses one
    latent head, since MLA stores one ``D_kv`` vector per token and layer.
    """
    if name not in PRESETS:
        message = f"unknown geometry preset {name!r}: expected one of {', '.join(PRESETS)}"
        raise PoolError(message)
    dims = dict(PRESETS[name])
    if mla:
        dims["heads"] = 1
    return PoolGeometry(name=name, layout=layout, tokens=tokens, mla=mla, device=device, **dims)


def opaque(name: str, page_bytes: int, pages: int, layout: Layout = "page_first") -> PoolGeometry:
    """A pool of ``pages`` opaque pages of ``page_bytes`` bytes, each one contiguous fragment:
    one MLA layer of one token per page, uint8 (an engine's rows that are bytes to us)."""
    return PoolGeometry(
        name=name,
        layout=layout,
        layers=1,
        heads=1,
        head_dim=page_bytes,
        dtype="uint8",
        page_size=1,
        tokens=pages,
        mla=True,
    )


def fragment_offsets(geometry: PoolGeometry, pages: npt.ArrayLike) -> Int64Array:
    """Byte offsets from the buffer start of every fragment of the given pages.

    Returns shape ``(fragments_per_page, n)``: row ``f`` is fragment ``f`` in plane (memory)
    order, so ``ravel()`` is fragment-major and a run of consecutive pages is a run of adjacent,
    contiguous entries. In MHA ``layer_first`` ``f = kv·L + layer`` (all K layers, then all V).
    """
    page_array = check_pages(geometry, pages)
    base = np.arange(geometry.fragments_per_page, dtype=np.int64) * geometry.plane_bytes
    return np.add.outer(base, page_array * geometry.fragment_bytes)


@dataclass(frozen=True, slots=True)
class BufferInfo:
    """Where a validated pool buffer lives: its address, size in bytes and device."""

    address: int
    nbytes: int
    device: str


def validate_buffer(geometry: PoolGeometry, buffer: object) -> BufferInfo:
    """Check that ``buffer`` (a torch tensor or numpy array) is the pool ``geometry`` describes.

    Checks device, dtype, shape, C-contiguous strides and that the memory may be written (a
    ``get`` writes into it: a read-only numpy array, or a host buffer in a read-only mapping
    such as ``np.memmap(mode="r")``, would be corrupted or crash the process), in that order,
    and refuses the pool with a :class:`PoolError` naming the field. The buffer is never
    copied: the address returned is the buffer's own.
    """
    torch = sys.modules.get("torch")  # a tensor can only exist if torch was imported
    if torch is not None and isinstance(buffer, torch.Tensor):
        device = str(buffer.device)
        dtype = str(buffer.dtype).removeprefix("torch.")
        shape = tuple(buffer.shape)
        strides = tuple(s * buffer.element_size() for s in buffer.stride())
    elif isinstance(buffer, np.ndarray):
        device, dtype, shape, strides = "cpu", buffer.dtype.name, buffer.shape, buffer.strides
    else:
        _refuse_buffer(geometry, "type", "a torch.Tensor or numpy.ndarray", type(buffer).__name__)

    if not _same_device(geometry.device, device):
        _refuse_buffer(geometry, "device", geometry.device, device)
    if dtype != geometry.dtype:
        _refuse_buffer(geometry, "dtype", geometry.dtype, dtype)
    if shape != geometry.shape:
        _refuse_buffer(geometry, "shape", str(geometry.shape), str(shape))
    expected_strides = _c_strides(geometry.shape, geometry.itemsize)
    # A stride of a size-1 axis is never used to address anything; torch and numpy may set it
    # to anything for views, so only the others must match.
    if any(n != 1 and s != e for n, s, e in zip(shape, strides, expected_strides, strict=True)):
        _refuse_buffer(
            geometry,
            "strides",
            f"C-contiguous byte strides {expected_strides}",
            f"{strides} (pass a contiguous tensor; .contiguous() copies)",
        )

    if isinstance(buffer, np.ndarray):
        if not buffer.flags.writeable:
            _refuse_buffer(
                geometry,
                "writability",
                "a writeable array (get() writes into the pool)",
                "a read-only array (e.g. np.frombuffer of bytes, or np.memmap mode 'r')",
            )
        address = int(buffer.__array_interface__["data"][0])
    else:
        address = int(buffer.data_ptr())
    if address == 0:
        _refuse_buffer(geometry, "storage", "allocated memory", "a tensor whose storage is freed")
    if device == "cpu" and not _os.writable_range(address, geometry.nbytes):
        _refuse_buffer(
            geometry,
            "memory",
            "memory this process may write (get() writes into the pool)",
            "a read-only or unmapped range (a read-only file mapping?)",
        )
    return BufferInfo(address=address, nbytes=geometry.nbytes, device=device)


def check_unchanged(geometry: PoolGeometry, buffer: object, info: BufferInfo) -> None:
    """Refuse a pool whose buffer moved, shrank or was freed since :func:`validate_buffer`.

    Cheap enough for every call (a data pointer, a shape and, for torch, the storage size):
    copies go to the address validated at registration, so a tensor that ``set_()`` or
    ``untyped_storage().resize_(0)`` emptied since would be written after it was freed.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(buffer, torch.Tensor):
        address, shape = int(buffer.data_ptr()), tuple(buffer.shape)
        storage = buffer.untyped_storage()
        end = address - int(storage.data_ptr()) + info.nbytes
        intact = storage.data_ptr() != 0 and storage.nbytes() >= end
    else:
        array: Any = buffer
        address, shape = int(array.__array_interface__["data"][0]), array.shape
        intact = True
    if address != info.address or shape != geometry.shape or not intact:
        message = (
            f"pool {geometry.name!r}: its buffer changed since register_pool (address "
            f"{info.address:#x} -> {address:#x}, shape {geometry.shape} -> {shape}"
            f"{'' if intact else ', storage freed or shrunk'}); the pipeline copies to the "
            "registered memory, so keep the tensor's storage alive and in place, or register "
            "the new buffer in a new pipeline"
        )
        raise PoolError(message)


def _refuse_buffer(geometry: PoolGeometry, field: str, expected: str, got: str) -> NoReturn:
    message = f"pool {geometry.name!r} refused: buffer {field}: expected {expected}, got {got}"
    raise PoolError(message)


def _same_device(wanted: str, got: str) -> bool:
    # "cuda" accepts any GPU; "cuda:1" only that one. torch prints a CPU device as "cpu".
    if ":" in wanted:
        return got == wanted
    return got.split(":")[0] == wanted


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides = []
    step = itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def page_indices(geometry: PoolGeometry, token_indices: object) -> Int64Array:
    """Page numbers of host token indices as SGLang passes them, validated.

    ``token_indices`` (torch tensor, numpy array or sequence) is 1-D, integer, ``n·page_size``
    long, and each page's tokens are consecutive and start page-aligned, all in
    ``[0, tokens)``. Returns the ``n`` page numbers as int64. Raises :class:`IndicesError`
    naming the pool and the first offending position.
    """
    flat = _as_int64(geometry, token_indices, "token indices")
    size = geometry.page_size
    if flat.size % size:
        _refuse_indices(
            geometry,
            f"token indices length: expected a multiple of page_size {size}",
            f"{flat.size}",
        )
    rows = flat.reshape(-1, size)
    firsts = rows[:, 0]
    if _well_formed(rows, firsts, geometry.tokens):
        return firsts // size
    _explain_indices(geometry, flat)
    raise AssertionError("unreachable: malformed token indices were not explained")


def key_pages(geometry: PoolGeometry, keys: Sequence[str], indices: Any) -> np.ndarray:
    """The page of each key: :func:`page_indices` of ``indices``, one page per key (else an
    :class:`IndicesError` naming the pool and how many token indices a key takes)."""
    pages = page_indices(geometry, indices)
    if len(pages) != len(keys):
        message = (
            f"pool {geometry.name!r}: {len(keys)} keys but indices for {len(pages)} pages; "
            f"pass {geometry.page_size} token indices per key"
        )
        raise IndicesError(message)
    return pages


def _well_formed(rows: Int64Array, firsts: Int64Array, tokens: int) -> bool:
    """Whether every row is ``page_size`` consecutive tokens from a page-aligned first one in
    ``[0, tokens)``: the common case, in a few passes (this runs before a read's first copy)."""
    size = rows.shape[1]
    if len(firsts) == 0:
        return True
    if np.any(firsts % size) or int(firsts.min()) < 0 or int(firsts.max()) > tokens - size:
        return False
    if size == 1:
        return True
    flat = rows.reshape(-1)
    steps = flat[1:] - flat[:-1] == 1  # contiguous passes: twice as fast as by rows
    steps[size - 1 :: size] = True  # from one page's last token to the next page's first
    return bool(steps.all())


def _explain_indices(geometry: PoolGeometry, flat: Int64Array) -> None:
    """Raise :class:`IndicesError` for the first offence in ``flat`` (not well formed)."""
    size = geometry.page_size
    _refuse_first(
        geometry,
        (flat < 0) | (flat >= geometry.tokens),
        flat,
        lambda pos: f"token index at position {pos}: expected 0 <= index < {geometry.tokens}",
    )
    rows = flat.reshape(-1, size)
    firsts = rows[:, 0]
    _refuse_first(
        geometry,
        firsts % size != 0,
        firsts,
        lambda row: (
            f"token index at position {row * size} (first of page {row}): "
            f"expected a multiple of page_size {size}"
        ),
    )
    expected = (firsts[:, None] + np.arange(size, dtype=np.int64)).ravel()
    _refuse_first(
        geometry,
        rows.ravel() != expected,
        flat,
        lambda pos: (
            f"token index at position {pos}: expected {int(expected[pos])} "
            f"(each page's tokens consecutive)"
        ),
    )


def check_pages(geometry: PoolGeometry, pages: object) -> Int64Array:
    """Validate already-paged indices: 1-D integer page numbers in ``[0, pages)``; as int64."""
    flat = _as_int64(geometry, pages, "page indices")
    _refuse_first(
        geometry,
        (flat < 0) | (flat >= geometry.pages),
        flat,
        lambda pos: f"page index at position {pos}: expected 0 <= page < {geometry.pages}",
    )
    return flat


def _as_int64(geometry: PoolGeometry, values: object, what: str) -> Int64Array:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.size == 0 and array.dtype.kind == "f" and not isinstance(values, np.ndarray):
        # np.asarray([]) is float64; an empty list is still a valid, empty request.
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        _refuse_indices(geometry, f"{what} dtype: expected an integer dtype", str(array.dtype))
    if array.ndim != 1:
        _refuse_indices(geometry, f"{what}: expected a 1-D array", f"shape {array.shape}")
    if array.dtype == np.uint64 and array.size and int(array.max()) > np.iinfo(np.int64).max:
        pos = int(np.argmax(array > np.iinfo(np.int64).max))
        _refuse_indices(geometry, f"{what} at position {pos}: expected an int64", str(array[pos]))
    return array.astype(np.int64, copy=False)


def _refuse_indices(geometry: PoolGeometry, expected: str, got: str) -> NoReturn:
    message = f"pool {geometry.name!r}: {expected}, got {got}"
    raise IndicesError(message)


def _refuse_first(
    geometry: PoolGeometry, offends: Any, values: Int64Array, expected: Callable[[int], str]
) -> None:
    """Refuse the first position where ``offends`` holds, naming its value in ``values`` and
    what ``expected(position)`` says; nothing where none offends."""
    if offends.any():
        pos = int(np.argmax(offends))
        _refuse_indices(geometry, expected(pos), str(int(values[pos])))
