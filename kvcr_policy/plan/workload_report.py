"""A trace plan as people read it: a heading, then one table of capacities per eviction."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .figures import Plan, sized

__all__ = ["trace_tables"]


def _count(n: float) -> str:
    """A token count in three significant figures: 1M, 2.5M, 512k."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}"


def _rate(bytes_per_s: float | None) -> str:
    return "-" if bytes_per_s is None else f"{bytes_per_s / 1e9:.3g} GB/s"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _heading(plan: Plan) -> list[str]:
    t, g, link = plan.figures["trace"], plan.figures["geometry"], plan.figures["link"]
    duration = t["duration_s"]
    arrivals = (
        f"over {duration:.0f} s ({t['requests_per_s']:.2f} requests/s)" if duration else "at once"
    )
    speed = (
        f"{link['gigabytes_per_s']:.1f} GB/s per host (from {link['from']}), shared by its "
        f"{link['ranks_sharing']} rank(s): {link['gigabytes_per_s_per_rank']:.2f} GB/s each; "
        "'of link' is the host's restores over it"
        if link["gigabytes_per_s"]
        else "none: give --link-limit (e.g. 50GB/s) or --measure-link"
    )
    return [
        f"trace {Path(t['path']).name}: {t['requests']} requests, {_count(t['input_tokens'])} "
        f"input tokens {arrivals}; {t['distinct_blocks']} distinct blocks of "
        f"{t['block_tokens']} tokens",
        f"most reachable hit rate: {t['max_hit_rate']:.1%} (no capacity limit; holding every "
        f"block takes {_count(t['tokens_to_hold_every_block'])} tokens)",
        f"per rank: {sized(g['bytes_per_token_rank'])} per token, "
        f"{sized(g['bytes_per_block_rank'])} per block ({g['pools_per_rank']} pool(s)); "
        f"{g['ranks_per_host']} rank(s) per host (tp {g['tp']}, pp {g['pp']})",
        f"link limit: {speed}",
    ]


#: A table's columns: each one's header and its cell of a row (a dict of the figures).
Columns = tuple[tuple[str, Callable[[dict[str, Any]], str]], ...]

#: The columns of an eviction strategy's table, a row a capacity.
_CAPACITIES: Columns = (
    ("capacity", lambda row: _count(row["capacity_tokens"])),
    ("hit rate", lambda row: f"{row['hit_rate']:.1%}"),
    ("of max", lambda row: _share(row["share_of_max"])),
    ("tier/rank", lambda row: sized(row["tier_bytes_per_rank"])),
    (
        "tier/host",
        lambda row: sized(row["tier_bytes_per_host"]) + ("!" if row["fits_host"] is False else ""),
    ),
    ("restores/rank", lambda row: _rate(row["restore_bytes_per_s_rank"])),
    ("of link", lambda row: _share(row["link_share"])),
)

#: The columns of the cascade's table, a row a DRAM capacity.
_CASCADE: Columns = (
    ("DRAM", lambda row: _count(row["dram_capacity_tokens"])),
    ("alone", lambda row: f"{row['dram_alone_hit_rate']:.1%}"),
    (
        "+ disk",
        lambda row: f"{row['cascade_hit_rate_at_least']:.1%}-{row['cascade_hit_rate']:.1%}",
    ),
    ("DRAM restores", lambda row: _rate(row["dram_restore_bytes_per_s_rank"])),
    ("of link", lambda row: _share(row["dram_limit_share"])),
    ("disk restores", lambda row: _rate(row["disk_restore_bytes_per_s_rank"])),
    ("of disk", lambda row: _share(row["disk_limit_share"])),
)


def _grid(title: str, columns: Columns, rows: list[dict[str, Any]]) -> Table:
    """A table under a left-aligned ``title``: ``columns`` right-justified, one line a row."""
    table = Table(title=escape(title), title_justify="left", box=None, pad_edge=False)
    for header, _ in columns:
        table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*(cell(row) for _, cell in columns))
    return table


def _table(replay: dict[str, Any]) -> Table:
    title = f"eviction {replay['eviction']} (from {replay['eviction_from']})"
    return _grid(title, _CAPACITIES, replay["capacities"])


def _lines(replay: dict[str, Any]) -> list[str]:
    """The 90 % line, and the largest listed capacity that fits the host beside it."""
    rows = {r["capacity_tokens"]: r for r in replay["capacities"]}
    enough = replay["smallest_capacity_tokens_for_90pct_of_max"]
    if enough is None:
        lines = ["90% of the most reachable: no listed capacity reaches it"]
    else:
        fits = rows[enough]["fits_host"]
        note = " (does not fit the host)" if fits is False else ""
        lines = [f"90% of the most reachable: {_count(enough)} tokens (smallest listed){note}"]
    largest = replay["largest_capacity_tokens_that_fits_host"]
    if largest is not None:
        row = rows[largest]
        lines.append(
            f"largest listed that fits the host: {_count(largest)} tokens, "
            f"{row['hit_rate']:.1%} ({_share(row['share_of_max'])} of max), "
            f"{sized(row['tier_bytes_per_host'])} per host"
        )
    elif any(r["fits_host"] is False for r in rows.values()):
        lines.append("largest listed that fits the host: none")
    return lines


def _cascade(plan: Plan, replay: dict[str, Any]) -> Table:
    disk = plan.figures["disk"]
    limit = f"{disk['gigabytes_per_s']:.3g} GB/s" if disk["gigabytes_per_s"] else "no --disk-limit"
    size = _count(disk["capacity_tokens"])
    title = f"  DRAM alone against DRAM + {size} tokens of disk ({limit})"
    return _grid(title, _CASCADE, replay["cascade"])


def trace_tables(plan: Plan) -> Group:
    """The heading, a table per eviction strategy, the 90 % line, the bytes replay, warnings."""
    parts: list[Any] = [Text(line) for line in _heading(plan)]
    for replay in plan.figures["evictions"]:
        parts += [Text(""), _table(replay)]
        parts += [Text(line) for line in _lines(replay)]
        if "cascade" in replay:
            parts += [Text(""), _cascade(plan, replay)]
    if any(r["fits_host"] is False for e in plan.figures["evictions"] for r in e["capacities"]):
        parts.append(Text("!: more tier than the host's memory"))
    found_all = plan.figures.get("bytes_replays", [])
    if found_all:
        first = found_all[0]
        parts += [Text(""), Text(f"with real bytes, the first {first['requests']} requests:")]
    for found in found_all:
        verdict = "agrees with the model" if found["agrees"] else "DIFFERS from the model"
        parts.append(
            Text(
                f"  {found['eviction']} at {_count(found['capacity_tokens'])} "
                f"({found['tier_pages']} tier pages): {found['hit_blocks']} hit blocks (model "
                f"{found['model_hit_blocks']}), {found['pages_verified']} of "
                f"{found['pages_restored']} restored pages verified: {verdict}"
            )
        )
        parts += [Text(f"    ! {problem}") for problem in found["problems"]]
    for warning in plan.warnings:
        parts.append(Text(f"! {warning}"))
    return Group(*parts)
