"""``kvcr-policy replay``: the command's options, made into a
:class:`~kvcr_policy.replay.setup.ReplaySetup` that :func:`kvcr_policy.replay.command.run_command`
runs."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from ..replay.setup import DEFAULT_TRACE, MAX_BLOCK_TOKENS, MAX_REPEAT, MAX_REQUESTS, ReplaySetup
from .options import PlainFormat, overrides

__all__ = ["replay"]


class Engine(str, Enum):
    vllm = "vllm"
    sglang = "sglang"


def replay(
    engine: Annotated[Engine, typer.Option("--engine", help="vllm or sglang.")],
    trace: Annotated[
        Path,
        typer.Option(
            "--trace",
            show_default=False,
            help="A Mooncake-format trace (.jsonl, .xz or .gz) [default: the bundled "
            "conversation trace, data/traces/].",
        ),
    ] = DEFAULT_TRACE,
    requests: Annotated[
        int, typer.Option("--requests", min=1, max=MAX_REQUESTS, help="The first N requests.")
    ] = 30,
    profile: Annotated[str, typer.Option("--profile", "-p", help="The tier's profile.")] = (
        "throughput"
    ),
    vs: Annotated[
        str | None,
        typer.Option("--vs", help="Baseline: the tier with this profile (default: no L3 tier)."),
    ] = None,
    tp: Annotated[
        int, typer.Option("--tp", min=1, max=2, help="sglang: tensor-parallel ranks (1 or 2).")
    ] = 1,
    mla: Annotated[bool, typer.Option("--mla", help="sglang: an MLA model's pools.")] = False,
    block_tokens: Annotated[
        int,
        typer.Option(
            "--block-tokens",
            min=0,
            max=MAX_BLOCK_TOKENS,
            help="Tokens per block id of the trace; 0: vllm 32, sglang 512.",
        ),
    ] = 0,
    output_tokens: Annotated[
        int, typer.Option("--output-tokens", min=1, max=256, help="Greedy tokens per request.")
    ] = 8,
    passes: Annotated[
        int,
        typer.Option(
            "--passes", min=2, max=4, help="Passes over the requests; the last is measured."
        ),
    ] = 2,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override one value of the tier's configuration: KEY=VALUE."),
    ] = None,
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="The tier's backend (backend.name); peer: a `kvcr-policy serve` of the "
            "replay's own, one per run [default: the profile's].",
        ),
    ] = None,
    tier_rate: Annotated[
        str | None,
        typer.Option(
            "--tier-rate",
            help="With --backend peer: that serve's tenant bandwidth limit, with a unit "
            "(e.g. 50MB/s) [default: no limit].",
        ),
    ] = None,
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat",
            min=1,
            max=MAX_REPEAT,
            help="Rounds of every run, in rotating orders; the figures are the medians.",
        ),
    ] = 1,
) -> None:
    """Replay a request trace through a real engine, without and with the L3 tier: TTFT,
    prefill saved, hits, and whether the greedy outputs are identical."""
    setup = ReplaySetup(
        engine=engine.value,
        trace=trace,
        requests=requests,
        profile=profile,
        vs=vs,
        tp=tp,
        mla=mla,
        block_tokens=block_tokens,
        output_tokens=output_tokens,
        passes=passes,
        overrides=overrides(set_),
        format=format.value,
        backend=backend,
        tier_rate=tier_rate,
        repeat=repeat,
    )
    from ..replay.command import run_command

    run_command(setup)
