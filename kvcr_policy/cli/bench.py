"""``bench``: the options become a :class:`~kvcr_policy.bench.command.BenchCommand` that
:func:`kvcr_policy.bench.command.run` runs (imported only when the command runs: the bench
stays off every other command's import path)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from ..config.selection import profile_or
from ..model.shape import ShapeOptions
from .axes import BackendOpt, LayoutOpt, ScatterOpt, TargetOpt, TokensOpt
from .figure import check_figure_path
from .geometry import geometry_options
from .numbers import MAX_HOLD_S, MAX_RANKS, MAX_REPEAT, Finite
from .options import PlainFormat, SetOpt, Target, overrides

__all__ = ["bench"]


class Via(str, Enum):
    local = "local"
    ucx = "ucx"


class Peer(str, Enum):
    hicache_file = "hicache-file"
    sglang_mooncake = "sglang-mooncake"


@geometry_options
def bench(
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            "-p",
            help="Profile measured (P): a bundled name or a path (else KVCR_POLICY_PROFILE, "
            "else throughput).",
        ),
    ] = None,
    vs: Annotated[str, typer.Option("--vs", help="Baseline profile (Q).")] = "default",
    layout: LayoutOpt = "layer_first",
    tokens: TokensOpt = 8192,
    target: TargetOpt = Target.cpu,
    transport: Annotated[
        Via, typer.Option("--transport", help="local tier, or ucx: the same as --backend peer.")
    ] = Via.local,
    backend: BackendOpt = None,
    peer: Annotated[
        Peer | None,
        typer.Option(
            "--peer", help="Compare P with SGLang's HiCacheFile or its own Mooncake backend."
        ),
    ] = None,
    ucx_tls: Annotated[str, typer.Option("--ucx-tls", help="auto, sm or tcp.")] = "auto",
    repeat: Annotated[int, typer.Option("--repeat", min=1, max=MAX_REPEAT)] = 5,
    scatter: ScatterOpt = False,
    set_: SetOpt = None,
    screen_pct: Annotated[
        float | None,
        typer.Option(
            "--screen",
            parser=Finite(0, 100, "%"),
            help="Exit 1 if P is this % below Q in either order (0..100).",
        ),
    ] = None,
    sweep: Annotated[
        bool,
        typer.Option("--sweep", help="Run every page shape of the target's matrix: one table."),
    ] = False,
    plot: Annotated[str | None, typer.Option("--plot", help="Write a PNG of every run.")] = None,
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
    vs_set: Annotated[
        list[str] | None,
        typer.Option(
            "--vs-set",
            help="Override one value of Q only, after --set (repeatable).",
        ),
    ] = None,
    metrics: Annotated[
        str | None,
        typer.Option("--metrics", help="Serve /metrics on HOST:PORT (a bare PORT: loopback)."),
    ] = None,
    metrics_hold: Annotated[
        float | None,
        typer.Option(
            "--metrics-hold",
            parser=Finite(0, MAX_HOLD_S, "s"),
            help="Seconds /metrics stays up after the run (default: until interrupted).",
        ),
    ] = None,
    ranks: Annotated[
        int,
        typer.Option(
            "--ranks",
            min=1,
            max=MAX_RANKS,
            help="Tensor-parallel ranks: one process each (one GPU each on cuda), all restoring "
            "their shards at once.",
        ),
    ] = 1,
    devices: Annotated[
        str | None,
        typer.Option(
            "--devices",
            help="cuda: the GPU of each rank, e.g. 0,0 (two ranks on GPU 0) or 0,1; one index "
            "per rank. Default: rank r on GPU r.",
        ),
    ] = None,
    *,
    shape: ShapeOptions,
) -> None:
    """Store and restore KV pages with two profiles; ratios to limits measured in the same run."""
    from ..bench.command import BenchCommand, run

    if plot and not sweep:  # a sweep refuses --plot itself
        check_figure_path(plot)  # before the run, not after it
    command = BenchCommand(
        profile=profile_or(profile, "throughput"),
        vs=vs,
        peer=None if peer is None else peer.value,
        overrides=overrides(set_),
        vs_overrides=overrides(vs_set),
        shape=shape,
        layout=layout,
        tokens=tokens,
        scatter=scatter,
        target=target.value,
        transport=transport.value,
        backend=backend,
        ucx_tls=ucx_tls,
        repeat=repeat,
        ranks=ranks,
        devices=devices,
        screen_pct=screen_pct,
        plot=plot or None,
        json=format is PlainFormat.json,
        metrics=metrics,
        metrics_hold=metrics_hold,
        sweep=sweep,
    )
    run(command)
