"""SGLang host pools whose layout kvcr_policy models, and the key namespace of every pool.

The zero-copy path (the pipeline moves bytes straight between the pool's ``kv_buffer`` and the
tier) is taken only for the classes in :data:`KNOWN_LAYOUTS`, named by module and class, never
for a subclass or a look-alike: ``MHATokenToKVPoolMXFP8Host`` subclasses the MHA pool and keeps
its scales outside ``kv_buffer``, so moving ``kv_buffer`` alone would lose them. Every other pool
goes through SGLang's own page description (:mod:`.access`). Importing SGLang's ``pool_host``
package drags in model configs (and torchvision), so classes are compared by name and the
attributes read here are plain ones every ``HostKVCache`` sets. The pool's ``kv_buffer`` is then
checked against the geometry by the pipeline (:func:`kvcr_policy.geometry.validate_buffer`), so
a pool whose attributes and tensor disagree is refused, never misread.

Attributes read, from SGLang 0.5.23 ``mem_cache/pool_host``:
``base.py`` (HostKVCache): ``layout``, ``page_size``, ``size`` (tokens, with the padding page),
``dtype``, ``dcp_size``, ``storage_format_tag``, ``stores_page_envelope``; ``mha.py``
(MHATokenToKVPoolHost): ``layer_num``, ``head_num``, ``head_dim``, ``v_head_dim``,
``kv_buffer``; ``mla.py`` (MLATokenToKVPoolHost): ``layer_num``, ``kv_cache_dim``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import quote

from ...errors import PoolError
from ...geometry import PoolGeometry
from ...keys import key_part

__all__ = [
    "KNOWN_LAYOUTS",
    "Namespace",
    "class_name",
    "geometry_of",
    "known_geometry",
    "namespace_for",
    "pool_name",
]

#: Host pool classes whose byte layout :class:`PoolGeometry` models exactly (SGLang 0.5.23).
KNOWN_LAYOUTS = frozenset(
    {
        "sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost",
        "sglang.srt.mem_cache.pool_host.mla.MLATokenToKVPoolHost",
    }
)

# Pools SGLang shards by TP rank even for MLA models, whose KV is replicated across TP ranks
# (HiCacheFile._get_suffixed_key keys only Mamba state by tp_config_suffix).
TP_SHARDED_POOLS = frozenset({"mamba"})


def pool_name(name: object) -> str:
    """``PoolName.KV`` -> ``"kv"``: SGLang's pool names are ``str`` enums."""
    value = getattr(name, "value", name)
    return str(value)


def class_name(pool: object) -> str:
    """``module.Class`` of ``pool``'s own class."""
    cls = type(pool)
    return f"{cls.__module__}.{cls.__qualname__}"


def known_geometry(pool: Any, name: str) -> PoolGeometry | None:
    """The geometry of a pool of a :data:`KNOWN_LAYOUTS` class in a layout kvcr_policy models,
    else None (the pool then goes through its own page description)."""
    if class_name(pool) not in KNOWN_LAYOUTS:
        return None
    try:
        if getattr(pool, "layout", None) == "page_unified":
            return unified_geometry(pool, name)
        return geometry_of(pool, name)
    except PoolError:
        return None


def unified_geometry(pool: Any, name: str) -> PoolGeometry:
    """A ``page_unified`` pool as opaque page blocks: one contiguous block per page.

    SGLang 0.5.23 ``pool_host/page_unified.py``: the buffer is ``page_dims(page_num)``, "whose
    C-contiguous order IS the byte order", page first, so page ``p`` is ``kv_buffer[p]``,
    ``bytes_per_page`` long. Modelled as an MLA ``page_first`` pool of one layer whose token
    rows are ``bytes_per_page / page_size`` bytes of uint8 (registered through a byte view of
    ``kv_buffer``, no copy).
    """
    layout = getattr(pool, "page_unified_layout", None)
    buffer = getattr(pool, "kv_buffer", None)
    if layout is None or buffer is None or getattr(pool, "dcp_size", 1) != 1:
        _refuse(name, pool, "page_unified without its PageUnifiedLayout, buffer, or with DCP")
    page_num, page_size = int(pool.page_num), int(pool.page_size)
    if tuple(buffer.shape) != tuple(layout.page_dims(page_num)) or not buffer.is_contiguous():
        _refuse(name, pool, f"page_unified buffer {tuple(buffer.shape)} is not its page_dims")
    return PoolGeometry(
        name=name,
        layout="page_first",
        layers=1,
        heads=1,
        head_dim=int(layout.bytes_per_page) // page_size,
        dtype="uint8",
        page_size=page_size,
        tokens=page_num * page_size,
        mla=True,
        device=str(buffer.device),
    )


def _refuse(name: str, pool: object, what: str) -> NoReturn:
    message = f"pool {name!r} ({type(pool).__name__}) refused: {what}"
    raise PoolError(message)


def geometry_of(pool: Any, name: str) -> PoolGeometry:
    """The :class:`PoolGeometry` of an SGLang MHA or MLA host pool; :class:`PoolError` if none.

    Refused, with the reason: pools without one ``kv_buffer`` tensor (Mamba, DSA indexer and
    other state pools), DCP-sharded pools, page envelopes, asymmetric K/V head dims, and any
    layout :class:`PoolGeometry` does not model (``page_unified``, ``page_first_kv_split``).
    """
    buffer = getattr(pool, "kv_buffer", None)
    if buffer is None or not hasattr(buffer, "data_ptr"):
        _refuse(name, pool, "no single kv_buffer tensor (only MHA and MLA KV pools are kept)")
    if getattr(pool, "dcp_size", 1) != 1:
        _refuse(name, pool, f"DCP-sharded pools (dcp_size={pool.dcp_size}) are not supported")
    if getattr(pool, "stores_page_envelope", False):
        _refuse(name, pool, "page-envelope host pools are not supported")
    mla = hasattr(pool, "kv_cache_dim")
    if mla:
        heads, head_dim = 1, int(pool.kv_cache_dim)
    else:
        heads, head_dim = int(pool.head_num), int(pool.head_dim)
        v_head_dim = int(getattr(pool, "v_head_dim", head_dim))
        if v_head_dim != head_dim:
            _refuse(name, pool, f"K head dim {head_dim} != V head dim {v_head_dim}")
    return PoolGeometry(
        name=name,
        layout=pool.layout,
        layers=int(pool.layer_num),
        heads=heads,
        head_dim=head_dim,
        dtype=str(pool.dtype).removeprefix("torch."),
        page_size=int(pool.page_size),
        tokens=int(pool.size),
        mla=mla,
        device=str(buffer.device),
    )


@dataclass(frozen=True, slots=True)
class Namespace:
    """The key prefix of one pool on one rank; ``label`` says what it encodes."""

    label: str
    prefix: str

    def keys(self, keys: Sequence[str]) -> list[str]:
        prefix = self.prefix
        return [prefix + key for key in keys]


def namespace_for(
    storage_config: Any, name: str, digest: str, *, format_tag: str | None = None
) -> Namespace:
    """Namespace keys by the rank's full coordinate, the pool and the geometry digest.

    Model, TP rank and size, PP, attention-CP, DP rank and (when on) DCP come from SGLang's
    ``HiCacheStorageConfig``. ``digest`` names the byte layout of a page (a geometry's
    :meth:`~kvcr_policy.geometry.PoolGeometry.digest`, or a pool's own description). MLA KV is
    the same on every TP rank and SGLang writes it from one rank only (``is_storage_writer``),
    so MLA pools other than Mamba state share it across TP ranks, as HiCacheFile does.
    """
    c = storage_config
    replicated = bool(getattr(c, "is_mla_model", False)) and name not in TP_SHARDED_POOLS
    tp = "replicated" if replicated else f"{c.tp_rank}/{c.tp_size}"
    # The free-text parts are percent-encoded (unchanged for the usual names), so no model or
    # pool name can hold the ';' and '=' that join the parts: one label, one deployment.
    parts = [
        f"model={quote(c.model_name or '', safe='/', errors='surrogatepass')}",
        f"tp={tp}",
        f"pp={c.pp_rank}/{c.pp_size}",
        f"cp={c.attn_cp_rank}/{c.attn_cp_size}",
        f"dp={getattr(c, 'dp_rank', 0)}",
    ]
    dcp_size = getattr(c, "dcp_size", 1)
    if dcp_size > 1:
        parts.append(f"dcp={c.dcp_rank}/{dcp_size}")
    parts += [f"pool={key_part(name)}", f"geometry={digest}"]
    if format_tag:
        parts.append(f"format={format_tag}")
    label = ";".join(parts)
    # A short digest, not the label, goes in every key: keys stay small in the store and on
    # the wire to peers, and the label is logged once per pool.
    prefix = hashlib.sha256(label.encode()).hexdigest()[:16] + ":"
    return Namespace(label=label, prefix=prefix)
