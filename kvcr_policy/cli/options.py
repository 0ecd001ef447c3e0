"""What several commands share: the consoles, the ``--profile``/``--set``/``--format`` options,
``KEY=VALUE`` pairs, sizes and JSON output."""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Annotated, Any

import typer
from rich.console import Console

from ..values import parse_size, shorten

__all__ = [
    "LAYOUT_HELP",
    "Format",
    "PlainFormat",
    "ProfileOpt",
    "SetOpt",
    "Target",
    "err",
    "out",
    "overrides",
    "print_json",
    "size_option",
]

#: The pool layouts, listed in each --layout's help (geometry.LAYOUTS, without its import cost).
LAYOUT_HELP = "layer_first, page_first, page_first_direct or page_head."

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


class Format(str, Enum):
    table = "table"
    json = "json"
    toml = "toml"


class PlainFormat(str, Enum):
    table = "table"
    json = "json"


class Target(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile", "-p", help="Bundled profile name or path (else KVCR_POLICY_PROFILE)."
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override one value (repeatable)."),
]


def overrides(pairs: list[str] | None, option: str = "--set") -> dict[str, str]:
    """``KEY=VALUE`` pairs of a repeatable option, in order (a later key wins)."""
    result: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {shorten(pair)}", param_hint=option)
        result[key.strip()] = value
    return result


def size_option(text: str, option: str = "--size") -> int:
    """A size option (``1GiB``): the same rule and bound as ``placement.capacity_bytes``, the
    size of a real tier region."""
    from ..config.schema import MAX_TIER_BYTES

    return parse_size(text, what=option, high=MAX_TIER_BYTES)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
