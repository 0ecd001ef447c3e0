"""Help a person reads at 80 columns: value names, never Python types; and ``--version``.

typer labels a value by its annotation (``<str>``, ``<list[str]>``, ``<int range>``,
``<bool>``). :func:`plain_help` gives every command a class that names each value as a
command line does instead (``--profile PROFILE``, ``--set KEY=VALUE``, a flag takes none);
choices keep their ``<a|b>`` list. ``tests/cli/test_help.py`` renders every command's help at
80 columns and fails on a Python type, a line too long or a cut word.
"""

from __future__ import annotations

from enum import Enum
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

__all__ = [
    "JsonOnly",
    "PlainCommand",
    "PlainGroup",
    "package_version",
    "plain_help",
    "version_callback",
]


class JsonOnly(str, Enum):
    """``--format`` of a command whose report is JSON only (``serve``, ``sglang-config``): it
    takes ``--format json`` as every reporting command does."""

    json = "json"


#: Ranges from this bound up are not printed in help (they are sanity bounds).
_SANITY_BOUND = 1 << 20
#: Options whose value is a pair, named as it is typed.
_PAIRS = {"--set", "--vs-set"}


def package_version() -> str:
    """The installed distribution's version, else the one in the source tree's metadata."""
    try:
        return version("kvcr-policy")
    except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
        return "unknown"


def version_callback(value: bool) -> None:
    """``--version``: print ``kvcr-policy VERSION`` and stop before any command runs."""
    if value:
        typer.echo(f"kvcr-policy {package_version()}")
        raise typer.Exit(0)


def _no_type(*args: Any, **kwargs: Any) -> None:
    return None


def _plain(params: list[Any]) -> list[Any]:
    """Name each value of ``params`` as a command line does (once; typer's choices stay)."""
    for param in params:
        if param.metavar is not None:
            continue
        param.metavar = _value_name(param)
        if (getattr(param, "max", None) or 0) >= _SANITY_BOUND:
            # A bound far past any real value only guards against nonsense (the refusal
            # states it); printed, [1<=x<=1099511627776] would squeeze the help column.
            setattr(param, "_get_number_range_help_str", _no_type)  # noqa: B010
        if isinstance(param, TyperArgument):
            # An argument's name column already says PROFILES...; its type column would
            # repeat the annotation (<list[str]>).
            setattr(param, "display_type_rich", _no_type)  # noqa: B010 - an instance override
    return params


def _value_name(param: Any) -> str | None:
    """What the help shows after an option or for an argument; None keeps typer's label."""
    if isinstance(param, TyperArgument):
        return str(param.name).upper()  # the usage line adds "..." when it repeats
    if param.type_descriptor.is_choice:
        return None  # typer lists the choices: <cpu|cuda>
    if getattr(param, "is_flag", False):
        return ""
    long = max(param.opts, key=len)
    if long in _PAIRS:
        return "KEY=VALUE"
    return long.lstrip("-").replace("-", "_").upper()


class PlainCommand(TyperCommand):
    """A typer command whose help names values instead of their Python types."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))


class PlainGroup(TyperGroup):
    """The root command with the same plain help (``--version``, ``--help``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _plain(super().get_params(ctx))


def plain_help(app: typer.Typer) -> None:
    """Give every command of ``app`` registered so far the plain help (call it last)."""
    for info in app.registered_commands:
        if info.cls is None or info.cls is TyperCommand:
            info.cls = PlainCommand
