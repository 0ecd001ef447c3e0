"""A plan as people read it (a table in 80 columns) and as programs read it (JSON)."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

from .figures import Plan, sized

__all__ = ["break_even_lines", "plan_table"]


def _share(part: int, whole: int | None) -> str:
    return f" ({part / whole:.1%} of {sized(whole)})" if whole else ""


def _rows(plan: Plan, title: dict[str, Any]) -> list[tuple[str, str]]:
    g, t = plan.figures["geometry"], plan.figures["tier"]
    host = g["host_memory"]
    rows = [
        ("[geometry]", ""),
        ("  per token", f"{sized(g['bytes_per_token_rank'])} per rank, "
                              f"{sized(g['bytes_per_token_model'])} for the model"),
        ("  per page", f"{sized(g['bytes_per_page_rank'])} per rank ({g['page_size']} tokens; "
                             f"{g['fragments_per_page']} fragments of "
                             f"{sized(g['fragment_bytes'])})"),
        ("  a rank holds", f"{g['layers_per_rank']} layers x {g['heads_per_rank']} KV heads "
                         f"(tp {g['tp']}, pp {g['pp']}{', MLA' if g['mla'] else ''})"),
        ("[tier memory]", ""),
        ("  per rank", "none: one tier for the host's ranks (backend host)"
                       if t["shared_by_ranks"] else
                       f"{sized(t['bytes_per_rank'])} ({t['pools_per_rank']} pool(s) x "
                       f"{sized(t['capacity_bytes_per_pool'])})"),
        ("  per host", f"{sized(t['bytes_per_host'])} "
                       + (f"(one tier shared by {t['ranks_per_host']} ranks)"
                          if t["shared_by_ranks"] else f"({t['ranks_per_host']} ranks)")
                       + _share(t['bytes_per_host'], host)),
        ("  host memory", f"{sized(host)} (from {g['host_memory_from']})" if host else "unknown"),
        ("  pinned for DMA", f"{sized(t['pinned_bytes_per_rank'])} per rank, "
                             f"{sized(t['pinned_bytes_per_host'])} per host"
                             if t["pinned_bytes_per_rank"] else "none (not a CUDA pool)"),
        ("  huge pages", f"{t['huge_pages_per_rank']} per rank, {t['huge_pages_per_host']} per "
                         f"host of {sized(t['huge_page_bytes'])} (huge_pages {t['huge_pages']})"
                         if t["huge_pages"] != "off" else "none asked (huge_pages off)"),
        ("  holds", f"{t['pages_per_pool']} pages = {t['tokens_per_pool']} tokens per pool "
                    + ("for the host" if t["shared_by_ranks"] else "per rank")),
    ]  # fmt: skip
    r = plan.figures.get("restore")
    if r is None:  # refused before its figures (the refusal says why)
        return rows
    rows += [
        ("[restore]", ""),
        ("  prefix", f"{r['prefix_tokens']} tokens = {r['pages']} pages, "
                     f"{sized(r['bytes'])} per rank"),
        ("  batches", f"{r['batches']} of up to {r['pages_per_batch']} pages; "
                      f"{r['batches_in_flight']} in flight ({r['windows']} windows)"),
        ("  descriptors", f"{r['descriptors_before_coalescing']} before coalescing, "
                          f"{r['descriptors_after_coalescing']} after, "
                          f"{r['descriptors_after_split']} after split"),
        ("  tier slots", "whole (each slot one contiguous page)" if r["tier_slots"] == "whole"
                         else "mirror the pool's planes"),
    ]  # fmt: skip
    ranks = r["ranks_restoring_at_once"]
    if r["link_gigabytes_per_s"]:
        rows.append(
            ("  link", f"{r['link_gigabytes_per_s']:.1f} GB/s per host (from {r['link_from']}), "
                       f"shared by its {ranks} rank(s): {r['link_gigabytes_per_s_per_rank']:.2f} "
                       "GB/s each while all restore at once")
        )  # fmt: skip
    if r["predicted_seconds"] is not None:
        rows.append(
            ("  predicted time", f"{r['predicted_seconds']:.3f} s: {sized(r['bytes'])} per rank "
                                 f"x {ranks} rank(s) = {sized(r['bytes_per_host'])} per host")
        )  # fmt: skip
    elif r["predicted_seconds_held"] is not None:
        rows.append(
            ("  predicted time", f"none for the whole prefix (larger than the tier); the "
                                 f"{r['held_tokens']} tokens it holds: "
                                 f"{r['predicted_seconds_held']:.3f} s")
        )  # fmt: skip
    else:
        hint = "no link limit: give --link-limit (e.g. 50GB/s) or --measure-link"
        rows.append(("  predicted time", hint))
    return rows


def plan_table(plan: Plan, title: dict[str, Any]) -> Table:
    """The plan's figures and warnings as a two-column table."""
    heading = ", ".join(f"{k} {v}" for k, v in title.items() if v is not None)
    table = Table(title=f"plan: {heading}", title_justify="left", box=None, pad_edge=False,
                  show_header=False)  # fmt: skip
    table.add_column("figure", no_wrap=True)
    table.add_column("value", overflow="fold")
    if "geometry" in plan.figures:
        for key, value in _rows(plan, title):
            style = "bold cyan" if key.startswith("[") else None
            table.add_row(escape(key), escape(value), style=style)
    if plan.warnings:
        table.add_row("[warnings]", "", style="bold yellow")
        for warning in plan.warnings:
            table.add_row("  !", escape(warning))
    return table


def break_even_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per backend: its break-even prefix (below it, recomputing wins)."""
    lines = []
    for row in rows:
        rate = f"{row['restore_bytes_per_s'] / 1e6:,.1f} MB/s ({row['rate_from']})"
        if row["tokens"] is None:
            verdict = f"recomputing wins at every prefix up to {row['up_to_tokens']:,} tokens"
        else:
            verdict = f"restoring wins from {row['tokens']:,} tokens (below, recomputing)"
        lines.append(f"break-even {row['backend']} at {rate}: {verdict}")
    return lines
