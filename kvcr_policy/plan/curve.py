"""``plan --trace --plot``: the hit rate against the capacity, one line per eviction strategy.

A figure file written with matplotlib (the ``plot`` extra, as ``bench --plot``): PNG, SVG or
PDF by the file's suffix, which any browser or viewer opens. The capacity axis is logarithmic
(the listed sizes usually span decades); a dashed line marks the most any capacity can reach
(the replay without a limit), a ring the smallest listed capacity reaching 90 % of it, and a
dotted red line the most tokens the host's memory holds as tier (with ``--host-memory`` or the
host's own): capacities right of it do not fit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["write_curve"]


def write_curve(figures: dict[str, Any], path: str) -> None:
    """Draw the plan's ``figures`` (``Plan.figures`` of a trace plan) into ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    trace = figures["trace"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for replay in figures["evictions"]:
        rows = replay["capacities"]
        tokens = [row["capacity_tokens"] for row in rows]
        line = ax.plot(tokens, [row["hit_rate"] for row in rows], marker="o")[0]
        line.set_label(replay["eviction"])
        enough = replay["smallest_capacity_tokens_for_90pct_of_max"]
        for row in rows:
            if row["capacity_tokens"] == enough:
                ax.plot([enough], [row["hit_rate"]], marker="o", markersize=14,
                        fillstyle="none", color=line.get_color())  # fmt: skip
    geo = figures["geometry"]
    if geo["host_memory"]:
        per_token = geo["bytes_per_block_rank"] * geo["ranks_per_host"] / trace["block_tokens"]
        fits = geo["host_memory"] / per_token
        ax.axvline(fits, linestyle=":", color="red",
                   label=f"host memory ({fits / 1e6:.3g}M tokens fit)")  # fmt: skip
    best = trace["max_hit_rate"]
    ax.axhline(best, linestyle="--", color="grey", label=f"no capacity limit ({best:.1%})")
    ax.set_xscale("log")
    ax.set_xlabel(f"tier capacity (tokens; blocks of {trace['block_tokens']})")
    ax.set_ylabel("prefix hit rate (hit tokens / input tokens)")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(bottom=0)
    ax.set_title(
        f"{Path(trace['path']).name}: {trace['requests']} requests "
        "(ring: smallest capacity reaching 90 % of the limit)",
        fontsize=10,
    )
    ax.legend(title="eviction")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
