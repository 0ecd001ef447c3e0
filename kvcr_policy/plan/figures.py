"""make_plan: what a configuration will need and do on a host, worked out before deploying.

Every figure is computed with the objects a pipeline would use: the geometry's own byte
arithmetic, the configured batching and coalescing strategies from the registry, real
descriptors for a restore batch (:func:`~kvcr_policy.descriptors.build_descriptors`, shaped by
the strategy within the backend's capabilities), and the batching window's own ``admits``.
Each input carries its origin (:class:`Given`), so a refusal names the value and where it came
from.

Per rank: MHA heads are split over TP (``heads / tp``; one replicated head when TP exceeds the
KV heads, as SGLang does); an MLA latent is replicated on every TP rank; layers are split over
PP (the largest stage counted). Every rank of a host holds its own tier for each pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..builtin.batching import least_pages
from ..config.loading import LoadedConfig
from ..config.schema import MAX_TIER_BYTES
from ..descriptors import build_descriptors, slot_descriptors, split_pieces
from ..geometry import PoolGeometry
from ..model.shape import ModelShape
from ..values import sized
from .batches import SAMPLE_PAGES, count_batches
from .restore_time import link_figures, restore_time

__all__ = [
    "Given",
    "Plan",
    "PlanRequest",
    "geometry_given",
    "make_plan",
    "rank_geometry",
    "sized",
]

_HOST_SHARE_WARN = 0.75  # a tier above this share of the host's memory leaves little for the rest
_PINNED_SHARE_WARN = 0.5


@dataclass(frozen=True, slots=True)
class Given:
    """An input of the plan and where it came from (``--tp``, ``profile ... [placement]``)."""

    value: Any
    origin: str


@dataclass(frozen=True)
class PlanRequest:
    """What the plan is asked about; every value with its origin."""

    geometry: dict[str, Given]  # layers, heads, head_dim, dtype, page_size, mla, layout
    tp: Given
    pp: Given
    ranks_per_host: Given
    pools: Given
    tokens: Given
    prefix_tokens: Given
    host_memory: Given  # bytes, or value None where unknown
    link_gbps: Given  # GB/s, or value None


@dataclass
class Plan:
    """The figures (plain data, JSON-ready), warnings (risky) and refusals (cannot work)."""

    figures: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**self.figures, "warnings": self.warnings, "refusals": self.refusals}


def _origin(loaded: LoadedConfig, path: str) -> str:
    """Where ``path`` came from, a bundled profile by name and a file by a short path."""
    from ..config.table import short_origin

    return short_origin(loaded.origin(path))


def geometry_given(shape: ModelShape, layout: Given) -> dict[str, Given]:
    """The model's dimensions (:func:`~kvcr_policy.model.shape.resolve_shape`), each with its
    origin, its name and the layout."""
    fields = {key: Given(value, shape.origins.get(key, "default")) for key, value in
              shape.dims().items()}  # fmt: skip
    return {**fields, "name": Given(shape.name, "the model"), "layout": layout}


def rank_geometry(request: PlanRequest, plan: Plan) -> PoolGeometry | None:
    g = {k: v.value for k, v in request.geometry.items()}
    tp, pp = request.tp.value, request.pp.value
    heads = g["heads"]
    if g["mla"]:
        rank_heads = 1
    elif heads % tp == 0:
        rank_heads = heads // tp
    elif tp % heads == 0:
        rank_heads = 1  # SGLang replicates KV heads when TP exceeds them
    else:
        plan.refusals.append(
            f"--tp {tp} (from {request.tp.origin}) neither divides nor is a multiple of the "
            f"{heads} KV heads (from {request.geometry['heads'].origin}): no rank layout exists"
        )
        return None
    layers = math.ceil(g["layers"] / pp)
    return PoolGeometry(
        name="kv", layout=g["layout"], layers=layers, heads=rank_heads, head_dim=g["head_dim"],
        dtype=g["dtype"], page_size=g["page_size"], tokens=g["page_size"], mla=bool(g["mla"]),
    )  # fmt: skip


def _strategies(loaded: LoadedConfig) -> tuple[Any, Any, frozenset[str]]:
    """The configured batching and coalescing objects, and what the backend lets through."""
    config = loaded.config
    registry = loaded.registry
    assert registry is not None  # every load_config result carries its registry
    batching = registry.get("batching", config.batching.strategy).create(
        config.batching, options=config.batching.options
    )
    coalescing = registry.get("coalescing", config.coalescing.strategy).create(
        config.coalescing, options=config.coalescing.options
    )
    return batching, coalescing, coalescing.needs & registry.capabilities(config)


def _memory(loaded: LoadedConfig, request: PlanRequest, geo: PoolGeometry, plan: Plan) -> None:
    config = loaded.config
    capacity = int(config.placement.capacity_bytes)
    capacity_from = _origin(loaded, "placement.capacity_bytes")
    written = loaded.size("placement.capacity_bytes")  # 64GB (59.6 GiB): as the user wrote it
    pools, ranks = request.pools.value, request.ranks_per_host.value
    shared = _shared_by_ranks(loaded, geo.mla and request.tp.value > 1)
    per_rank = capacity * pools
    per_host = per_rank if shared else per_rank * ranks
    slots = capacity // geo.page_bytes
    plan.figures["tier"] = {
        "capacity_bytes_per_pool": capacity,
        "pools_per_rank": pools,
        "ranks_per_host": ranks,
        "shared_by_ranks": shared,
        "bytes_per_rank": 0 if shared else per_rank,
        "bytes_per_host": per_host,
        "pages_per_pool": slots,
        "tokens_per_pool": slots * geo.page_size,
    }
    if geo.mla and request.tp.value > 1 and not shared:
        plan.refusals.append(
            f"backend.name = {config.backend.name!r} (from {_origin(loaded, 'backend.name')}) "
            f"gives each of the --tp {request.tp.value} ranks a tier of its own: SGLang writes "
            "MLA pages from TP rank 0 only and counts the fewest hits of any rank, so no rank "
            "would hit; use backend.name = 'host' (one tier per host, 'auto' for MLA at TP > 1)"
        )
    if slots < 1:
        plan.refusals.append(
            f"placement.capacity_bytes = {written} (from {capacity_from}) holds no page "
            f"of {sized(geo.page_bytes)}: raise it to at least {sized(geo.page_bytes)}"
        )
    host = request.host_memory.value
    if host is not None and per_host > host:
        times = (
            "one tier shared by the host's ranks"
            if shared
            else (f"{ranks} ranks per host (from {request.ranks_per_host.origin})")
        )
        plan.refusals.append(
            f"placement.capacity_bytes = {written} (from {capacity_from}) x {pools} "
            f"pool(s) (from {request.pools.origin}) x {times} = {sized(per_host)} of tier, "
            f"more than the host's {sized(host)} of memory (from {request.host_memory.origin}); "
            "lower placement.capacity_bytes or run fewer ranks per host"
        )
    elif host is not None and per_host > _HOST_SHARE_WARN * host:
        plan.warnings.append(
            f"the tier takes {per_host / host:.0%} of the host's memory ({sized(per_host)} of "
            f"{sized(host)}): little is left for the engine's host KV pool and the system"
        )
    if slots and request.tokens.value > slots * geo.page_size:
        plan.warnings.append(
            f"--tokens {request.tokens.value} (from {request.tokens.origin}) is more than the "
            f"{slots * geo.page_size} tokens a pool's tier holds "
            f"{'for the host' if shared else 'per rank'}: the oldest pages will be evicted"
        )
    pinned = per_rank if config.transport.name == "cuda" and not shared else 0
    plan.figures["tier"]["pinned_bytes_per_rank"] = pinned
    plan.figures["tier"]["pinned_bytes_per_host"] = pinned * ranks
    if host is not None and pinned * ranks > _PINNED_SHARE_WARN * host:
        plan.warnings.append(
            f"{sized(pinned * ranks)} of the host's memory will be pinned for DMA "
            f"(transport.name 'cuda', from {_origin(loaded, 'transport.name')}): pinned memory "
            "cannot be swapped or reclaimed"
        )
    _huge_pages(loaded, per_rank, 1 if shared else ranks, plan)


def _shared_by_ranks(loaded: LoadedConfig, mla_at_tp: bool) -> bool:
    """Whether the ranks of a host use one tier: the ``host`` and ``peer`` backends, and
    ``auto`` for an MLA model at TP > 1 (what the SGLang backend makes of it; see
    :mod:`kvcr_policy.integrations.sglang.startup`)."""
    config = loaded.config
    name = config.backend.name
    if name == "auto":
        return config.transport.name == "ucx" or mla_at_tp
    return name in ("host", "peer")


def _huge_pages(loaded: LoadedConfig, per_rank: int, ranks: int, plan: Plan) -> None:
    from ..memory.linux import huge_page_size, thp_mode

    advice = loaded.config.placement.huge_pages
    size = huge_page_size()
    needed = math.ceil(per_rank / size) if advice != "off" else 0
    plan.figures["tier"].update(
        huge_pages=advice,
        huge_page_bytes=size,
        huge_pages_per_rank=needed,
        huge_pages_per_host=needed * ranks,
    )
    mode = thp_mode()
    if advice == "require" and mode not in ("always", "madvise"):
        plan.warnings.append(
            f"placement.huge_pages = 'require' (from {_origin(loaded, 'placement.huge_pages')}) "
            f"but transparent huge pages are {mode or 'absent'} on this machine: the tier "
            "will fail to open here (/sys/kernel/mm/transparent_hugepage/enabled)"
        )


def _restore(loaded: LoadedConfig, request: PlanRequest, geo: PoolGeometry, plan: Plan) -> None:
    config = loaded.config
    batching, coalescing, allowed = _strategies(loaded)
    tokens = request.prefix_tokens.value
    pages = math.ceil(tokens / geo.page_size)
    least = config.batching.read_batch_bytes
    counts = count_batches(batching, pages, least_pages(least, geo.page_bytes))
    if counts is None:
        plan.refusals.append(
            f"batching.strategy {config.batching.strategy!r} (from "
            f"{_origin(loaded, 'batching.strategy')}) does not settle on one batch size, so a "
            f"restore is planned for at most {SAMPLE_PAGES} pages; --prefix-tokens {tokens} (from "
            f"{request.prefix_tokens.origin}) is {pages} pages: lower it"
        )
        return
    batch = counts.largest
    if batch * geo.page_bytes > MAX_TIER_BYTES:
        plan.refusals.append(
            f"one batch of {batch} pages of {sized(geo.page_bytes)} is "
            f"{sized(batch * geo.page_bytes)}, more than the {sized(MAX_TIER_BYTES)} any tier "
            "may hold: lower batching.read_batch_pages or the model's dimensions"
        )
        return
    plain = coalesced = sent = 0
    # A prefix stored together sits in consecutive slots; every batch of the same size has the
    # same descriptors, so each distinct size is shaped once.
    full = replace(geo, tokens=max(batch, 1) * geo.page_size)
    whole = _whole_slots(loaded)
    for size, times in counts.sizes.items():
        order = np.arange(size)
        if whole:  # the tier side slot by slot, as the run lays it out
            shaped_in = slot_descriptors(full, order, full, order, read=True)
        else:
            shaped_in = build_descriptors(full, order, full, order)
        shaped = coalescing.prepare(shaped_in, allowed)
        plain += times * len(shaped_in)
        sent += times * len(shaped)
        coalesced += times * (len(shaped) - (0 if shaped is shaped_in else split_pieces(shaped)))
    inflight = _in_flight(batching.window, counts.total, batch, geo.page_bytes)
    nbytes = pages * geo.page_bytes
    plan.figures["restore"] = {
        "prefix_tokens": tokens,
        "pages": pages,
        "bytes": nbytes,
        "batches": counts.total,
        "pages_per_batch": batch,
        "descriptors_before_coalescing": plain,
        "descriptors_after_coalescing": coalesced,
        "descriptors_after_split": sent,
        "tier_slots": "whole" if whole else "mirror",
        "batches_in_flight": inflight,
        "windows": math.ceil(counts.total / inflight) if counts.total else 0,
    }
    missing = coalescing.needs - allowed
    if missing:
        plan.warnings.append(
            f"coalescing.strategy {config.coalescing.strategy!r} (from "
            f"{_origin(loaded, 'coalescing.strategy')}) asks to {', '.join(sorted(missing))} "
            "descriptors, which the backend cannot: plain descriptors are sent instead"
        )
    window_bytes = config.batching.window_bytes
    if window_bytes is not None and int(window_bytes) < batch * geo.page_bytes:
        plan.refusals.append(
            f"batching.window_bytes = {sized(int(window_bytes))} (from "
            f"{_origin(loaded, 'batching.window_bytes')}) is smaller than one batch: "
            f"batching.read_batch_pages = {batch} (from "
            f"{_origin(loaded, 'batching.read_batch_pages')}) x {sized(geo.page_bytes)} = "
            f"{sized(batch * geo.page_bytes)}; raise window_bytes or lower read_batch_pages"
        )
    capacity = int(config.placement.capacity_bytes)
    if batch * geo.page_bytes > capacity >= geo.page_bytes:
        plan.warnings.append(
            f"one batch ({sized(batch * geo.page_bytes)}) is larger than a pool's tier "
            f"(placement.capacity_bytes = {sized(capacity)}, from "
            f"{_origin(loaded, 'placement.capacity_bytes')}): a store of a full batch cannot fit"
        )
    link = link_figures(
        request.link_gbps.value, request.link_gbps.origin, request.ranks_per_host.value
    )
    restore, tier = plan.figures["restore"], plan.figures["tier"]
    timing, warnings = restore_time(restore, tier, geo.page_size, link)
    restore.update(timing)
    plan.warnings += warnings


def _in_flight(window: Any, total: int, batch: int, page_bytes: int) -> int:
    """Batches of ``batch`` pages the window admits at once (``Window.admits``, worked out
    instead of stepped: a window of 10**9 one-page batches is one division, not a loop)."""
    most = total
    if window.batches is not None:
        most = min(most, window.batches)
    if window.pages is not None and batch:
        most = min(most, window.pages // batch)
    if window.bytes is not None and batch * page_bytes:
        most = min(most, window.bytes // (batch * page_bytes))
    return max(1, most)


def make_plan(loaded: LoadedConfig, request: PlanRequest) -> Plan:
    """Work out the plan; refusals and warnings are collected, never raised."""
    plan = Plan()
    for key, given in request.geometry.items():
        if ", over " in given.origin:  # an option that replaced a preset's value
            plan.warnings.append(f"{key} = {given.value} (from {given.origin}): the option wins")
    geo = rank_geometry(request, plan)
    if geo is None:
        return plan
    model = replace(
        geo, layers=request.geometry["layers"].value, heads=request.geometry["heads"].value
    )
    plan.figures["geometry"] = {
        "layout": geo.layout,
        "mla": geo.mla,
        "tp": request.tp.value,
        "pp": request.pp.value,
        "layers_per_rank": geo.layers,
        "heads_per_rank": geo.heads,
        "page_size": geo.page_size,
        "bytes_per_token_model": model.token_bytes,
        "bytes_per_token_rank": geo.token_bytes,
        "bytes_per_page_rank": geo.page_bytes,
        "fragments_per_page": geo.fragments_per_page,
        "fragment_bytes": geo.fragment_bytes,
        "host_memory": request.host_memory.value,
        "host_memory_from": request.host_memory.origin,
    }
    _memory(loaded, request, geo, plan)
    _restore(loaded, request, geo, plan)
    return plan


def _whole_slots(loaded: LoadedConfig) -> bool:
    """Whether the tier keeps each slot whole, as the configured transport says it will
    (``keeps_whole_slots(options, coalescing)`` of its registered factory, resolved without a
    device); a transport that does not say mirrors the pool's planes."""
    config, registry = loaded.config, loaded.registry
    assert registry is not None  # every load_config result carries its registry
    spec = registry.find("transport", config.transport.name)
    ask = None if spec is None else getattr(spec.factory, "keeps_whole_slots", None)
    if spec is None or ask is None:
        return False
    return bool(
        ask(spec.options.model_validate(config.transport.options), config.coalescing.strategy)
    )
