"""``plan``: sizing before deploying; the options become a :class:`~kvcr_policy.plan.command.
PlanCommand` that :func:`kvcr_policy.plan.command.run` runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..config.rates import MAX_LINK_GBPS, MIN_LINK_GBPS
from ..model.shape import ShapeOptions
from ..plan.trace import MAX_BLOCK_TOKENS, MAX_BYTES_REQUESTS
from .figure import check_figure_path
from .geometry import geometry_options
from .numbers import MAX_RANKS, MAX_TOKENS, Finite, RateOption
from .options import LAYOUT_HELP, PlainFormat, ProfileOpt, SetOpt, overrides, size_option

__all__ = ["plan"]


@geometry_options
def plan(
    tokens: Annotated[
        int | None,
        typer.Option("--tokens", min=1, max=MAX_TOKENS, help="Tokens the tier should hold."),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option("--trace", help="Replay a request trace (Mooncake's JSON lines) instead."),
    ] = None,
    capacity_tokens: Annotated[
        str | None,
        typer.Option(
            "--capacity-tokens",
            help="--trace: tier capacities to replay, e.g. 1000000,3M,10M (default: the "
            "profile's tier).",
        ),
    ] = None,
    block_tokens: Annotated[
        int | None,
        typer.Option(
            "--block-tokens",
            min=1,
            max=MAX_BLOCK_TOKENS,
            help="--trace: tokens per hash id (Mooncake's: 512).",
        ),
    ] = None,
    eviction: Annotated[
        str | None,
        typer.Option("--eviction", help="--trace: eviction strategies, e.g. lru,fifo."),
    ] = None,
    bytes_requests: Annotated[
        int | None,
        typer.Option(
            "--bytes",
            min=1,
            max=MAX_BYTES_REQUESTS,
            help="--trace: also store and restore real pages for the first N requests.",
        ),
    ] = None,
    plot: Annotated[
        str | None, typer.Option("--plot", help="--trace: draw hit rate against capacity here.")
    ] = None,
    disk_capacity_tokens: Annotated[
        str | None,
        typer.Option(
            "--disk-tokens",
            help="--trace: a disk level of this many tokens behind each capacity (the "
            "cascade backend), e.g. 10M.",
        ),
    ] = None,
    disk_gbps: Annotated[
        float | None,
        typer.Option(
            "--disk-limit",
            parser=RateOption(MIN_LINK_GBPS, MAX_LINK_GBPS),
            help="--trace: the disk level's restore rate with its unit, e.g. 2GB/s (from "
            "bench --backend file).",
        ),
    ] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
    layout: Annotated[str, typer.Option("--layout", help=LAYOUT_HELP)] = "layer_first",
    pp: Annotated[
        int | None, typer.Option("--pp", min=1, max=MAX_RANKS, help="Pipeline-parallel size.")
    ] = None,
    ranks_per_host: Annotated[
        int | None, typer.Option("--ranks-per-host", min=1, max=MAX_RANKS, help="Default: tp x pp.")
    ] = None,
    pools: Annotated[
        int | None, typer.Option("--pools", min=1, max=MAX_RANKS, help="Pools per rank.")
    ] = None,
    prefix_tokens: Annotated[
        int | None,
        typer.Option(
            "--prefix-tokens", min=1, max=MAX_TOKENS, help="Restore plan for this prefix."
        ),
    ] = None,
    host_memory: Annotated[
        str | None, typer.Option("--host-memory", help="e.g. 2TiB; default: this machine's.")
    ] = None,
    link_gbps: Annotated[
        float | None,
        typer.Option(
            "--link-limit",
            parser=RateOption(MIN_LINK_GBPS, MAX_LINK_GBPS),
            help="Link limit for the predicted time, with its unit: e.g. 50GB/s, 400Gbit/s.",
        ),
    ] = None,
    link_gbps_alias: Annotated[
        float | None,
        typer.Option(
            "--link-gbps",
            parser=RateOption(MIN_LINK_GBPS, MAX_LINK_GBPS),
            hidden=True,
            help="The former name of --link-limit; it takes the same rate with its unit.",
        ),
    ] = None,
    measure_link: Annotated[
        bool, typer.Option("--measure-link", help="Measure the link limit here with a probe.")
    ] = False,
    restore_rate: Annotated[
        list[str] | None,
        typer.Option(
            "--restore-rate",
            help="A backend's restore rate for its break-even prefix, NAME=RATE (e.g. "
            "peer=50MB/s); repeat for more. The configured backend's is the link limit.",
        ),
    ] = None,
    prefill_rate: Annotated[
        float | None,
        typer.Option(
            "--prefill-rate",
            parser=Finite(1e-3, 1e9, "tokens/s"),
            help="The engine's prefill, tokens/s, for the break-even [default: the "
            "configured gate's admission.options.prefill_tokens_per_s].",
        ),
    ] = None,
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
    *,
    shape: ShapeOptions,
) -> None:
    """Sizing before deploying: tier memory per rank and host, and the restore of a prefix;
    or, with --trace, the hit rate each tier capacity buys on a real request trace.

    Exit 2 when the plan cannot work (each reason names the value and where it came from);
    exit 1 when a --bytes replay differs from the model.
    """
    from ..plan.command import PlanCommand, run

    if plot is not None and trace is not None:
        check_figure_path(plot)  # before the trace is read and replayed
    command = PlanCommand(
        profile=profile,
        overrides=overrides(set_),
        tokens=tokens,
        prefix_tokens=prefix_tokens,
        trace=trace,
        capacity_tokens=capacity_tokens,
        block_tokens=block_tokens,
        eviction=eviction,
        bytes_requests=bytes_requests,
        plot=plot,
        disk_capacity_tokens=disk_capacity_tokens,
        disk_gbps=disk_gbps,
        shape=shape,
        layout=layout,
        pp=pp,
        ranks_per_host=ranks_per_host,
        pools=pools,
        host_memory=size_option(host_memory, "--host-memory") if host_memory else None,
        link_gbps=link_gbps if link_gbps is not None else link_gbps_alias,
        measure_link=measure_link,
        json=format is PlainFormat.json,
        restore_rates=tuple(restore_rate or ()),
        prefill_rate=prefill_rate,
    )
    run(command)
