"""make_trace_plan: what a tier of each listed capacity buys on a real request trace.

For every eviction strategy asked for and every capacity, the replay model
(:mod:`~.replay`) gives the prefix hit rate; the rank geometry of the plan gives the tier's
bytes per rank and per host for that capacity, and the bytes per second that restores must
deliver at the trace's arrival rate (hit tokens x bytes per token x pools / the trace's
duration), compared with the link limit (``--link-limit``, ``observability.link_limit_gbps`` or
``--measure-link``: the host's, shared by its ranks, so the host's restores are compared with
it). The replay with no capacity limit gives the most any capacity can reach, and for each
strategy the smallest listed capacity that reaches 90 % of it is named, next to the largest
listed capacity that fits the host's memory; capacities that do not fit are warned about.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from ..config.loading import LoadedConfig
from ..config.schema import MAX_TIER_BYTES, EvictionSection
from ..geometry import PoolGeometry
from .cascade import DiskLevel, cascade_rows
from .figures import Given, Plan, PlanRequest, rank_geometry, sized
from .replay import Replay, replay, replay_unbounded
from .restore_time import link_figures
from .trace import Trace

__all__ = ["MAX_CAPACITY_TOKENS", "Eviction", "make_trace_plan"]

#: Largest capacity asked about: 2**40 tokens.
MAX_CAPACITY_TOKENS = 1 << 40
#: The share of the most reachable hit rate that names "enough" capacity.
ENOUGH = 0.9


@dataclass(frozen=True, slots=True)
class Eviction:
    """An eviction strategy to replay with: its section (name and options) and origin."""

    section: EvictionSection
    origin: str

    @property
    def name(self) -> str:
        return str(self.section.strategy)


def _trace_figures(trace: Trace, unbounded: Replay) -> dict[str, Any]:
    duration = trace.duration_s
    distinct = len(set(trace.ids))
    return {
        "path": trace.path,
        "requests": trace.requests,
        "block_tokens": trace.block_tokens,
        "block_references": trace.references,
        "distinct_blocks": distinct,
        "input_tokens": trace.input_tokens,
        "duration_s": duration,
        "requests_per_s": trace.requests / duration if duration else None,
        "max_hit_rate": unbounded.hit_rate,
        "max_hit_tokens": unbounded.hit_tokens,
        "tokens_to_hold_every_block": distinct * trace.block_tokens,
    }


def _sizes(request: PlanRequest, geo: PoolGeometry, block_tokens: int) -> dict[str, Any]:
    pages_per_block = math.ceil(block_tokens / geo.page_size)
    return {
        "layout": geo.layout,
        "tp": request.tp.value,
        "pp": request.pp.value,
        "ranks_per_host": request.ranks_per_host.value,
        "pools_per_rank": request.pools.value,
        "bytes_per_token_rank": geo.token_bytes,
        "page_size": geo.page_size,
        "pages_per_block": pages_per_block,
        "bytes_per_block_rank": pages_per_block * geo.page_bytes * request.pools.value,
        "host_memory": request.host_memory.value,
        "host_memory_from": request.host_memory.origin,
    }


def _row(
    given: Given, found: Replay, best: Replay, trace: Trace, sizes: dict[str, Any], gbps: Any
) -> dict[str, Any]:
    per_rank = (found.capacity_blocks or 0) * sizes["bytes_per_block_rank"]
    ranks, host = sizes["ranks_per_host"], sizes["host_memory"]
    duration = trace.duration_s
    per_token = sizes["bytes_per_token_rank"] * sizes["pools_per_rank"]  # every pool restores
    rate = found.hit_tokens * per_token / duration if duration else None
    return {
        "capacity_tokens": given.value,
        "capacity_from": given.origin,
        "capacity_blocks": found.capacity_blocks,
        "hit_rate": found.hit_rate,
        "share_of_max": found.hit_tokens / best.hit_tokens if best.hit_tokens else None,
        "hit_tokens": found.hit_tokens,
        "hit_blocks": found.hit_blocks,
        "evictions": found.evictions,
        "tier_bytes_per_rank": per_rank,
        "tier_bytes_per_host": per_rank * ranks,
        "fits_host": per_rank * ranks <= host if host is not None else None,
        "restore_bytes_per_s_rank": rate,
        "restore_bytes_per_s_host": rate * ranks if rate is not None else None,
        # the host's ranks restore at once through the host's link (plan.restore_time)
        "link_share": rate * ranks / (gbps * 1e9) if rate is not None and gbps else None,
    }


def check_capacities(given: list[Given], block_tokens: int, geo: PoolGeometry | None) -> list[str]:
    """Refusals for capacities that hold no block or need a tier larger than any pool's."""
    refusals = []
    for capacity in given:
        tokens = capacity.value
        if tokens < block_tokens:
            refusals.append(
                f"capacity {tokens} tokens (from {capacity.origin}) holds no block of "
                f"{block_tokens} tokens (--block-tokens): list capacities of at least one block"
            )
        elif tokens > MAX_CAPACITY_TOKENS:
            refusals.append(
                f"capacity {tokens} tokens (from {capacity.origin}) is more than the "
                f"{MAX_CAPACITY_TOKENS} tokens a plan asks about"
            )
        elif geo is not None:
            blocks = tokens // block_tokens
            need = blocks * math.ceil(block_tokens / geo.page_size) * geo.page_bytes
            if need > MAX_TIER_BYTES:
                refusals.append(
                    f"capacity {tokens} tokens (from {capacity.origin}) needs {sized(need)} of "
                    f"tier per pool per rank, more than the {sized(MAX_TIER_BYTES)} a pool's "
                    "tier may have (placement.capacity_bytes)"
                )
    return refusals


def make_trace_plan(
    loaded: LoadedConfig,
    request: PlanRequest,
    trace: Trace,
    capacities: list[Given],
    evictions: list[Eviction],
    disk: Given | None = None,
) -> Plan:
    """Replay ``trace`` at every capacity with every eviction strategy; refusals collected.
    With ``disk`` (a :class:`~.cascade.DiskLevel`), each strategy also gets its ``cascade``
    rows: every capacity as the DRAM level in front of that disk level."""
    plan = Plan()
    geo = rank_geometry(request, plan)
    plan.refusals += check_capacities(capacities, trace.block_tokens, geo)
    if disk is not None:
        tokens = Given(disk.value.tokens, disk.origin)
        plan.refusals += check_capacities([tokens], trace.block_tokens, geo)
    if geo is None or plan.refusals:
        return plan
    registry = loaded.registry
    assert registry is not None  # every load_config result carries its registry
    best = replay_unbounded(trace)
    plan.figures["trace"] = _trace_figures(trace, best)
    sizes = plan.figures["geometry"] = _sizes(request, geo, trace.block_tokens)
    gbps = request.link_gbps.value
    plan.figures["link"] = link_figures(gbps, request.link_gbps.origin, sizes["ranks_per_host"])
    if disk is not None:
        plan.figures["disk"] = {
            "capacity_tokens": disk.value.tokens,
            "capacity_from": disk.origin,
            "gigabytes_per_s": disk.value.gbps,
            "from": "--disk-limit" if disk.value.gbps else None,
        }
    if not trace.duration_s:
        plan.warnings.append(
            f"every request of {trace.path} arrives at the same time: no arrival rate, so no "
            "restore rate"
        )
    replays = []
    for eviction in evictions:
        spec = registry.get("eviction", eviction.name)
        strategy = spec.create(eviction.section, options=eviction.section.options)
        start = time.perf_counter()
        rows = []
        for given in sorted(capacities, key=lambda g: g.value):
            blocks = given.value // trace.block_tokens
            found = replay(trace, blocks, strategy.new_policy(blocks))
            rows.append(_row(given, found, best, trace, sizes, gbps))
        enough = next(
            (r["capacity_tokens"] for r in rows if r["hit_tokens"] >= ENOUGH * best.hit_tokens),
            None,
        )
        fitting = [r["capacity_tokens"] for r in rows if r["fits_host"]]
        entry: dict[str, Any] = {
            "eviction": eviction.name,
            "eviction_from": eviction.origin,
            "options": dict(eviction.section.options),
            "capacities": rows,
            "smallest_capacity_tokens_for_90pct_of_max": enough,
            "largest_capacity_tokens_that_fits_host": max(fitting) if fitting else None,
        }
        if disk is not None:
            level: DiskLevel = disk.value
            entry["cascade"] = cascade_rows(
                trace, strategy, [r["capacity_tokens"] for r in rows], level,
                sizes["bytes_per_token_rank"] * sizes["pools_per_rank"], gbps,
            )  # fmt: skip
        entry["seconds"] = round(time.perf_counter() - start, 3)
        replays.append(entry)
    plan.figures["evictions"] = replays
    plan.warnings += fit_warnings(replays, sizes)
    return plan


def fit_warnings(replays: list[dict[str, Any]], sizes: dict[str, Any]) -> list[str]:
    """What the host's memory rules out: every listed capacity, some, or the 90 % one."""
    host = sizes["host_memory"]
    if host is None or not replays:
        return []
    rows = replays[0]["capacities"]  # the same capacities and bytes for every strategy
    over = [r for r in rows if r["fits_host"] is False]
    where = f"the host's {sized(host)} of memory (from {sizes['host_memory_from']})"
    if len(over) == len(rows):
        smallest = min(rows, key=lambda r: r["capacity_tokens"])
        return [
            f"no listed capacity fits {where}: the smallest, {smallest['capacity_tokens']} "
            f"tokens, needs {sized(smallest['tier_bytes_per_host'])} of tier per host; list "
            "smaller capacities, fewer ranks per host, or a host with more memory"
        ]
    found = []
    if over:
        names = ", ".join(str(r["capacity_tokens"]) for r in over)
        found.append(f"capacities {names} tokens need more tier than {where}")
    for found_replay in replays:
        enough = found_replay["smallest_capacity_tokens_for_90pct_of_max"]
        row = next((r for r in rows if r["capacity_tokens"] == enough), None)
        if row is not None and row["fits_host"] is False:
            largest = found_replay["largest_capacity_tokens_that_fits_host"]
            found.append(
                f"{found_replay['eviction']}: the capacity reaching 90 % of the most reachable, "
                f"{enough} tokens, does not fit {where}; the largest listed that fits is "
                f"{largest} tokens"
            )
    return found
