"""``kvcr-policy bench --sweep``: check the command line, run the matrix, print one table.

The matrix sets every shape's geometry, layout, tokens, scattering and ranks
(:mod:`.sweep`), so those options are refused beside ``--sweep`` (exit 2). A restore that did
not verify, or a shape whose ``--screen`` failed, exits 1 after the table.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console

from ..model.shape import ShapeOptions
from .progress import progress
from .resolve import resolve
from .runner import run_plan, steps
from .setup import BenchError, BenchSetup
from .sweep import MATRICES, run_sweep, sweep_table

__all__ = ["check_sweep", "run_sweep_command"]

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def check_sweep(
    shape: ShapeOptions,
    layout: str,
    tokens: int,
    scatter: bool,
    ranks: int,
    devices: str | None,
    plot: str | None,
    metrics: str | None,
) -> None:
    """Refuse what ``--sweep`` cannot take: the options each shape of the matrix sets."""
    given = [f"--{key.replace('_', '-')}" for key, value in vars_of(shape).items() if value]
    given += ["--layout"] * (layout != "layer_first") + ["--tokens"] * (tokens != 8192)
    given += ["--scatter"] * scatter + ["--ranks"] * (ranks != 1)
    given += ["--devices"] * (devices is not None) + ["--plot"] * (plot is not None)
    given += ["--metrics"] * (metrics is not None)
    if given:
        message = (
            f"--sweep runs every shape of the target's matrix, each with its own geometry, "
            f"layout, tokens, scattering and ranks; drop {', '.join(given)}"
        )
        raise BenchError(message)


def vars_of(shape: ShapeOptions) -> dict[str, Any]:
    """The options of ``shape`` that were given (``--mha`` counts as given)."""
    names = ("geometry", "model_config", "layers", "heads", "head_dim", "dtype", "page_size",
             "mla", "tp")  # fmt: skip
    return {name: getattr(shape, name) is not None for name in names}


def run_sweep_command(base: BenchSetup, screen_pct: float | None, format: str) -> None:
    """Run the matrix of ``base.target`` with ``base``'s profiles and options; print it."""
    if base.target not in MATRICES:
        raise BenchError(f"--sweep: no matrix for target {base.target!r}")
    shapes = MATRICES[base.target]
    plans = [resolve(shape.setup(base)) for shape in shapes]  # every shape checked first
    total = sum(steps(plan.setup) for plan in plans) + 2 * len(shapes)
    shown, say = progress(total, err)
    with shown:
        rows = run_sweep(shapes, lambda i: run_plan(plans[i], say), screen_pct, say)
    profiles = f"P = {base.profile}, Q = {base.vs}"
    if format == "json":
        data = {"sweep": base.target, "profiles": {"P": base.profile, "Q": base.vs},
                "repeat": base.repeat, "shapes": rows}  # fmt: skip
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        devices = sorted({str(row["device"]) for row in rows if row.get("device")})
        on = f" on {', '.join(devices)}" if devices else ""
        title = f"kvcr-policy bench --sweep: {base.target}{on}, {profiles}, over each run's limit"
        out.print(title, markup=False, highlight=False)
        out.print(sweep_table(rows), markup=False, highlight=False)
    sys.stdout.flush()
    if not all(row["verified"] for row in rows):
        err.print("restored bytes did not match what was stored", markup=False)
        raise typer.Exit(1)
    failed = [row["shape"] for row in rows if not row.get("screen", {}).get("passed", True)]
    if failed:
        err.print(f"regression screen failed for: {'; '.join(failed)}", markup=False)
        raise typer.Exit(1)
