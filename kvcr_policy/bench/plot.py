"""``--plot``: a PNG of every restore of a run and the two limits measured before each (the
path was checked by the command line, :mod:`kvcr_policy.cli.figure`)."""

from __future__ import annotations

from typing import Any

__all__ = ["write_plot"]


def write_plot(result: dict[str, Any], path: str) -> None:
    """Restore rates per run and side, and both limits, from ``BenchResult.to_dict()``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    runs = result.get("runs", [])
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label in sorted({r["profile"] for r in runs}):
        values = [r["restore_gigabytes_per_s"] for r in runs if r["profile"] == label]
        ax.plot(range(1, len(values) + 1), values, marker="o", label=f"{label} restore")
    lines = (("limit_gigabytes_per_s", "--", "limit"),
             ("host_copy_limit_gigabytes_per_s", ":", "host memory copy"))  # fmt: skip
    for key, style, name in lines:
        limits = [r[key] for r in runs if r.get("side") == "P" and key in r]
        if limits:
            ax.plot(range(1, len(limits) + 1), limits, linestyle=style, color="grey", label=name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("run")
    ax.set_ylabel("GB/s")
    ax.set_ylim(bottom=0)
    size = result.get("bytes", 0) / 2**30
    ax.set_title(f"{result.get('geometry')} {result.get('layout')}, {size:.2f} GiB")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
