"""The geometry options of ``plan``, ``bench`` and ``tune``, declared once.

:func:`geometry_options` adds them to a command function that takes ``shape:
ShapeOptions``: typer reads a command's options from its signature, so the decorator gives the
function a signature with one keyword parameter per option (``--geometry``, ``--model-config``,
``--layers``, ``--heads``, ``--head-dim``, ``--dtype``, ``--page-size``, ``--mla/--mha``,
``--tp``) in place of ``shape``, and gathers their values into the :class:`ShapeOptions` the
command receives. What they mean and how they combine: :mod:`kvcr_policy.model.shape`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from ..model.shape import ShapeOptions
from .numbers import MAX_DIM, MAX_RANKS

__all__ = ["geometry_options"]

F = TypeVar("F", bound=Callable[..., Any])

_OPTIONS: dict[str, Any] = {
    "geometry": Annotated[
        str | None,
        typer.Option("--geometry", help="A model preset: qwen3-32b or small."),
    ],
    "model_config": Annotated[
        Path | None,
        typer.Option(
            "--model-config",
            metavar="PATH",
            help="A model's Hugging Face config.json: its layers, KV heads (GQA), head dim, "
            "dtype and MLA latent.",
        ),
    ],
    "layers": Annotated[int | None, typer.Option("--layers", min=1, max=MAX_DIM)],
    "heads": Annotated[int | None, typer.Option("--heads", min=1, max=MAX_DIM, help="KV heads.")],
    "head_dim": Annotated[int | None, typer.Option("--head-dim", min=1, max=MAX_DIM)],
    "dtype": Annotated[str | None, typer.Option("--dtype", help="e.g. bfloat16.")],
    "page_size": Annotated[
        int | None, typer.Option("--page-size", min=1, max=MAX_DIM, help="Tokens per page.")
    ],
    "mla": Annotated[bool | None, typer.Option("--mla/--mha", help="An MLA latent pool.")],
    "tp": Annotated[
        int | None,
        typer.Option(
            "--tp", min=1, max=MAX_RANKS, help="Tensor-parallel size: divides the KV heads."
        ),
    ],
}


def geometry_options(func: F) -> F:
    """``func`` (which takes ``shape: ShapeOptions``) as a command with the geometry options."""
    signature = inspect.signature(func, eval_str=True)
    kept = [p for p in signature.parameters.values() if p.name != "shape"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
        for name, kind in _OPTIONS.items()
    ]
    ordered = sorted(kept, key=lambda p: p.kind == inspect.Parameter.KEYWORD_ONLY) + added

    @functools.wraps(func)
    def command(*args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name, None) for name in _OPTIONS}
        return func(*args, shape=ShapeOptions(**given), **kwargs)

    command.__signature__ = signature.replace(parameters=ordered)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in ordered}
    return command  # type: ignore[return-value]
