"""The options of the axes ``bench`` and ``tune`` measure on: target, backend, layout, tokens
and slot order."""

from __future__ import annotations

from typing import Annotated

import typer

from .numbers import MAX_TOKENS
from .options import LAYOUT_HELP, Target

__all__ = ["BackendOpt", "LayoutOpt", "ScatterOpt", "TargetOpt", "TokensOpt"]

TargetOpt = Annotated[Target, typer.Option("--target")]
BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend", help="Tier backend: dram, peer, kvcr or mooncake (default: the profile's)."
    ),
]
LayoutOpt = Annotated[str, typer.Option("--layout", help=LAYOUT_HELP)]
TokensOpt = Annotated[int, typer.Option("--tokens", min=1, max=MAX_TOKENS)]
ScatterOpt = Annotated[
    bool, typer.Option("--scatter", help="Store in a random order: scattered tier slots.")
]
