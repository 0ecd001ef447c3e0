"""One SGLang host pool bound to the pipeline: by its known layout, by its own page description,
as a logical anchor, or refused with what it lacks.

:func:`bind` tries, in order:

1. ``zero-copy``: a :data:`.pools.KNOWN_LAYOUTS` class in a layout :class:`PoolGeometry` models,
   whose ``get_page_buffer_meta`` agrees with the geometry on its first and last page. Its
   ``kv_buffer`` is registered as is; the pipeline moves pages between it and the tier with no
   copy in between.
2. ``pointers``: any pool whose ``get_page_buffer_meta`` lists a page's pieces
   (:class:`.access.PointerPages`), through a staging buffer (:mod:`.staged`).
3. ``tensors``: any pool with ``get_data_page`` / ``set_from_flat_data_page``
   (:class:`.access.TensorPages`), through a staging buffer.
4. ``logical``: an anchor that holds no page memory (``kv_buffer`` is None and its pages have no
   bytes: DeepSeek V4's ``LogicalHostPool``). Nothing is moved; its side pools carry the data.

A pool that fits none is refused with one :class:`PoolError` saying what each way needed and
what the pool lacked or raised.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import PoolError
from ...geometry import PoolGeometry, fragment_offsets
from ...pipeline import Pipeline
from .access import PageAccess, PointerPages, TensorPages, flat_pieces
from .memory import MemoryMap
from .pools import Namespace, class_name, known_geometry, namespace_for
from .staged import StagedPool

__all__ = ["Binding", "bind"]

log = logging.getLogger("kvcr_policy.integrations.sglang")


class _Direct:
    """The zero-copy mover: the pipeline itself, on the pool's own buffer."""

    def __init__(self, pipeline: Pipeline, name: str) -> None:
        self._pipeline, self._name = pipeline, name

    def get(self, keys: Sequence[str], token_indices: Any) -> list[bool]:
        return self._pipeline.get(list(keys), token_indices, self._name)

    def set(self, keys: Sequence[str], token_indices: Any) -> list[bool]:
        return self._pipeline.set(list(keys), token_indices, self._name)

    def exists(self, keys: Sequence[str]) -> int:
        return self._pipeline.exists(list(keys), self._name)


class _Logical:
    """An anchor without page memory: every page is there, and nothing moves."""

    def get(self, keys: Sequence[str], token_indices: Any) -> list[bool]:
        return [True] * len(keys)

    set = get

    def exists(self, keys: Sequence[str]) -> int:
        return len(keys)


@dataclass(frozen=True, slots=True)
class Binding:
    """A registered SGLang host pool: how it moves, its keys, and what one page weighs."""

    name: str
    host_pool: Any
    kind: str  # zero-copy | pointers | tensors | logical
    page_bytes: int
    namespace: Namespace
    description: str
    mover: Any  # _Direct | StagedPool | _Logical
    memory: MemoryMap  # what the pool owns: where the tensor API's pointers may point
    geometry: PoolGeometry | None = None  # the known layout's (kind "zero-copy" only)

    @property
    def summary(self) -> str:
        """``page_first, zero-copy``: the pool's layout and how it moves."""
        layout = getattr(self.host_pool, "layout", None)
        return f"{layout}, {self.kind}" if layout else self.kind


def _page_size(pool: Any) -> int:
    # Under DCP, SGLang indexes host pages by logical tokens (MLATokenToKVPoolHost).
    return int(getattr(pool, "logical_page_size", None) or pool.page_size)


def _tokens(pool: Any) -> int | None:
    """The pool's token capacity, None when it does not say (SGLang's own test pool): indices
    are then bounded only by the memory check every piece passes."""
    size = getattr(pool, "logical_size", None) or getattr(pool, "size", None)
    return int(size) if size else None


_TOP = (1 << 63) - 1


def _agrees(geometry: PoolGeometry, pool: Any) -> str | None:
    """None when ``get_page_buffer_meta`` lists exactly our bytes of the first and last page,
    else what differs (a release that changed the layout falls back to the generic path)."""
    base = int(pool.kv_buffer.data_ptr())
    for page in (0, geometry.pages - 1):
        tokens = _token_range(geometry.page_size, page)
        try:
            pointers, sizes = flat_pieces(pool.get_page_buffer_meta(tokens))
        except Exception as err:
            return f"get_page_buffer_meta raised {type(err).__name__}: {err}"
        # Ends in Python ints, capped at int64's top (that range then differs from ours).
        ends = [min(p + n, _TOP) for p, n in zip(pointers.tolist(), sizes.tolist(), strict=True)]
        theirs = MemoryMap.merged(zip(pointers.tolist(), ends, strict=True))
        starts = base + fragment_offsets(geometry, [page]).ravel()
        ours = MemoryMap.merged((int(s), int(s) + geometry.fragment_bytes) for s in starts)
        same = (theirs.starts.tolist(), theirs.ends.tolist()) == (
            ours.starts.tolist(),
            ours.ends.tolist(),
        )
        if not same:
            return f"page {page}: SGLang lists other bytes than the {geometry.layout} geometry"
    return None


def _token_range(page_size: int, page: int) -> Any:
    import torch

    return torch.arange(page * page_size, (page + 1) * page_size, dtype=torch.int64)


def _byte_view(buffer: Any, geometry: PoolGeometry) -> Any:
    """``buffer``'s bytes shaped as ``geometry`` says (a view: the same memory)."""
    return buffer.reshape(-1).view(_uint8()).view(geometry.shape)


def _uint8() -> Any:
    import torch

    return torch.uint8


def _unsafe(pool: Any) -> str | None:
    """Why a page of ``pool`` cannot be stored on its own under one key, or None."""
    if getattr(pool, "stores_page_envelope", False):
        return (
            "its page is an envelope of unified memory that sub-pools share (full and SWA lay "
            "their rows in one allocation), so restoring one pool's envelope would overwrite "
            "bytes another pool owns; SGLang 0.5.23 gives such pools only to backends that store "
            "the complete shared page (HybridCacheController.supports_page_envelope_host: mori), "
            "and with --hicache-storage-backend dynamic builds separate host pools, which this "
            "backend takes"
        )
    spec = getattr(getattr(pool, "placement", None), "spec", None)
    shards = int(getattr(spec, "shard_size", 1) or 1)
    if class_name(pool).endswith("PageInterleaveHostPool") and shards > 1:
        return (
            f"its pages are dealt round-robin over {shards} ranks (logical-page KV "
            "sharding): no rank holds a sequence's pages from the start, so a per-rank tier "
            "cannot answer batch_exists with a leading run every rank agrees on"
        )
    return None


def _digest(*parts: object) -> str:
    return hashlib.sha256(";".join(map(str, parts)).encode()).hexdigest()[:16]


def _logical(pool: Any) -> bool:
    if getattr(pool, "kv_buffer", "absent") is not None:
        return False
    get_page = getattr(pool, "get_data_page", None)
    try:
        return get_page is None or get_page(0, flat=True).numel() == 0
    except Exception:
        return False


def _staged_access(pool: Any, label: str, tried: list[str]) -> PageAccess | None:
    size = _page_size(pool)
    for method, access in (("get_page_buffer_meta", PointerPages), ("get_data_page", TensorPages)):
        if not callable(getattr(pool, method, None)):
            tried.append(f"it has no {method}()")
            continue
        try:
            return access.probe(pool, label, size)
        except Exception as err:
            tried.append(f"{method}() on page 0 failed: {type(err).__name__}: {err}")
    return None


def bind(pipeline: Pipeline, storage_config: Any, name: str, pool: Any) -> Binding:
    """Register ``pool`` as pipeline pool ``name``; :class:`PoolError` says why it cannot be."""
    label = f"pool {name!r} ({type(pool).__name__})"
    tag = getattr(pool, "storage_format_tag", None)

    def namespace(digest: str) -> Namespace:
        return namespace_for(storage_config, name, digest, format_tag=tag)

    unsafe = _unsafe(pool)
    if unsafe is not None:
        raise PoolError(f"{label} refused: {unsafe}")
    geometry = known_geometry(pool, name)
    if geometry is not None:
        unified = pool.layout == "page_unified"
        disagreement = None if unified else _agrees(geometry, pool)
        if disagreement is None:
            buffer = _byte_view(pool.kv_buffer, geometry) if unified else pool.kv_buffer
            pipeline.register_pool(name, geometry, buffer)
            ns = namespace(geometry.digest() + (":page-unified-v1" if unified else ""))
            return Binding(name, pool, "zero-copy", geometry.page_bytes, ns, str(geometry),
                           _Direct(pipeline, name), MemoryMap.of(pool), geometry)  # fmt: skip
        log.warning("kvcr_policy: %s: %s; moving it by its own page description", label,
                    disagreement)  # fmt: skip
    if _logical(pool):
        ns = namespace("logical")
        return Binding(name, pool, "logical", 0, ns, "logical anchor: no page memory", _Logical(),
                       MemoryMap.merged([]))  # fmt: skip
    tried: list[str] = []
    access = _staged_access(pool, label, tried)
    if access is None:
        message = (
            f"{label} refused: kvcr_policy does not model its layout, and a pool it does not "
            "model must describe its pages with get_page_buffer_meta(indices) (pointer lists) "
            "or get_data_page/set_from_flat_data_page (page tensors): " + "; ".join(tried)
        )
        raise PoolError(message)
    staged = StagedPool(pipeline, name, access, _tokens(pool))
    if isinstance(access, PointerPages):
        kind, shape = "pointers", f"{len(access.sizes)} pieces {access.sizes.tolist()[:8]}"
    else:
        kind, shape = "tensors", str(getattr(access, "dtype", "?"))
    layout = getattr(pool, "layout", None)
    digest = _digest(class_name(pool), layout, kind, access.page_bytes, shape)
    description = f"{kind}: {access.page_bytes} bytes a page ({shape}), layout {layout}"
    memory = access.memory if isinstance(access, PointerPages) else MemoryMap.of(pool)
    return Binding(name, pool, kind, access.page_bytes, namespace(digest), description, staged,
                   memory)  # fmt: skip
