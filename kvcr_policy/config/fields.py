"""Bounded option fields, one line each: a byte size (:func:`size_field`) or a number
(:func:`number_field`).

Every size and number an options model takes (the schema's sections, a transport's or a
backend's options, a plugin's) is bounded on both sides and every float is finite
(``tests/config/test_config_bounds.py`` walks them all). These helpers build the pydantic
``Field`` that says so, with its description and an optional :func:`~.tunable.tunable`
declaration, so that a model states each bound once and the same way.
"""

from __future__ import annotations

from typing import Any

from pydantic import ByteSize, Field

__all__ = ["number_field", "size_field"]


def size_field(
    default: int | None,
    high: int,
    description: str,
    *,
    low: int = 0,
    from_low: bool = False,
    tuned: dict[str, Any] | None = None,
) -> Any:
    """A byte size (annotate it ``Size`` or ``Size | None``; ``...`` as ``default``: required):
    more than ``low`` bytes (at least ``low`` with ``from_low``), at most ``high``."""
    value = default if default is None or default is ... else ByteSize(default)
    bound: dict[str, Any] = {"ge": low} if from_low else {"gt": low}
    return Field(value, **bound, le=high, description=description, json_schema_extra=tuned)


def number_field(
    default: Any,
    low: int | float,
    high: int | float,
    description: str,
    *,
    above: bool = False,
    finite: bool | None = None,
    tuned: dict[str, Any] | None = None,
) -> Any:
    """An int or a float from ``low`` (more than ``low`` with ``above``) to ``high``; a float
    (``finite``, by default when ``default`` or a bound is one) is never nan or infinite."""
    bound: dict[str, Any] = {"gt": low} if above else {"ge": low}
    if finite is None:
        finite = any(isinstance(value, float) for value in (default, low, high))
    extra: dict[str, Any] = {"allow_inf_nan": False} if finite else {}
    return Field(
        default, **bound, le=high, description=description, json_schema_extra=tuned, **extra
    )
