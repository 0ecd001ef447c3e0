"""``tune``: the options become a :class:`~kvcr_policy.tune.command.TuneCommand` (its search a
:class:`~kvcr_policy.tune.setup.TuneSetup`) that :func:`kvcr_policy.tune.command.run` runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

import typer

from ..config.selection import profile_or
from ..model.shape import ShapeOptions, resolve_shape
from ..tune.setup import MAX_BUDGET_S, MIN_BUDGET_S
from .axes import BackendOpt, LayoutOpt, ScatterOpt, TargetOpt, TokensOpt
from .geometry import geometry_options
from .numbers import MAX_REPEAT, MAX_SEED, Finite
from .options import PlainFormat, SetOpt, Target, overrides

__all__ = ["tune"]

T = TypeVar("T")


@geometry_options
def tune(
    start: Annotated[
        str | None,
        typer.Option(
            "--profile",
            "-p",
            "--from",
            help="Starting profile, the base the result extends (else KVCR_POLICY_PROFILE, "
            "else throughput).",
        ),
    ] = None,
    target: TargetOpt = Target.cpu,
    backend: BackendOpt = None,
    layout: LayoutOpt = "layer_first",
    tokens: TokensOpt = 8192,
    scatter: ScatterOpt = False,
    set_: SetOpt = None,
    budget: Annotated[
        float,
        typer.Option(
            "--budget",
            parser=Finite(MIN_BUDGET_S, MAX_BUDGET_S, "s"),
            help="Seconds for the whole run, confirmation included (1..604800).",
        ),
    ] = 300.0,
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat",
            min=1,
            max=MAX_REPEAT,
            help="Repeats per order confirming (and --remeasure).",
        ),
    ] = 9,
    trial_repeat: Annotated[
        int,
        typer.Option(
            "--trial-repeat", min=1, max=MAX_REPEAT, help="Repeats per order of each trial."
        ),
    ] = 3,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Search only this knob (repeatable).")
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", min=0, max=MAX_SEED, help="The sampler's seed.")
    ] = 0,
    write: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="PATH", help="Write the profile here if it wins."),
    ] = None,
    always_write: Annotated[
        bool,
        typer.Option("--output-always", help="Write the best candidate even if it loses."),
    ] = False,
    check_path: Annotated[
        Path | None,
        typer.Option(
            "--remeasure", metavar="PATH", help="Re-measure a written profile against its base."
        ),
    ] = None,
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
    prefill: Annotated[
        bool,
        typer.Option(
            "--prefill",
            help="Calibrate the engine's prefill rate on this host for the admission gate "
            "instead of searching; --output writes it as the gate's prefill_curve.",
        ),
    ] = False,
    write_alias: Annotated[Path | None, typer.Option("--write", hidden=True)] = None,
    always_alias: Annotated[bool, typer.Option("--always-write", hidden=True)] = False,
    check_alias: Annotated[Path | None, typer.Option("--check", hidden=True)] = None,
    *,
    shape: ShapeOptions,
) -> None:
    """Search the tunable knobs on this host; write the profile only if it wins."""
    from ..tune.command import TuneCommand, run
    from ..tune.setup import TuneSetup

    model = resolve_shape(shape, default="qwen3-32b")
    setup = TuneSetup(
        start=profile_or(start, "throughput"),
        geometry=model.name,
        layout=layout,
        tokens=tokens,
        target=target.value,
        backend=backend,
        mla=model.mla,
        dims={key: value for key, value in model.dims().items() if key != "mla"},
        tp=shape.tp,
        scatter=scatter,
        overrides=overrides(set_),
        budget_s=budget,
        repeat=repeat,
        trial_repeat=trial_repeat,
        only=tuple(only or ()),
        seed=seed,
    )
    # The former spellings, kept hidden: --write, --always-write and --check read like
    # `schema --write/--check` (regenerate, verify in place) but took a path and measured.
    command = TuneCommand(
        setup,
        write=_either(write, write_alias, "--output", "--write"),
        always_write=always_write or always_alias,
        check_path=_either(check_path, check_alias, "--remeasure", "--check"),
        json=format is PlainFormat.json,
        prefill=prefill,
    )
    run(command)


def _either(value: T | None, alias: T | None, name: str, former: str) -> T | None:
    """An option's value, given by its name or by its former (hidden) name, not both."""
    if value is not None and alias is not None:
        message = f"{former} is the former name of {name}: give {name} once"
        raise typer.BadParameter(message, param_hint=name)
    return alias if value is None else value
