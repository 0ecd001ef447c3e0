"""Pydantic's validation errors as :class:`~kvcr_policy.errors.ConfigIssue` lines: each at its
dotted path, with the origin of the value there, an unknown key with the nearest valid name."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ValidationError

from ..errors import ConfigIssue
from .provenance import origin_for
from .sources import UnknownKeys, echo, suggest

__all__ = ["issues_from"]


def _unknown_key(model: type[BaseModel], loc: list[str]) -> str:
    """``unknown key``, with the nearest valid name of the table that holds it."""
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return "unknown key"
        model = annotation
    names = list(model.model_fields)
    nearest = suggest(loc[-1], names) if loc else None
    hint = f"; did you mean {nearest!r}?" if nearest else ""
    return f"unknown key{hint} (valid: {', '.join(names) or 'none'})"


def issues_from(
    err: ValidationError, origins: Mapping[str, str], model: type[BaseModel], prefix: str = ""
) -> list[ConfigIssue]:
    issues = []
    unknown = UnknownKeys()
    for item in err.errors(include_url=False):
        loc = [str(part) for part in item["loc"]]
        path = prefix + ".".join(loc) if loc else prefix.rstrip(".") or "<config>"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            if not unknown.take(origin_for(origins, path)):
                continue
            message = _unknown_key(model, loc)
        elif item["type"] != "value_error":
            message = (
                f"expected: {message[0].lower()}{message[1:]}; got {echo(path, item['input'])}"
            )
        issues.append(ConfigIssue(path, origin_for(origins, path), message))
    return issues + unknown.rest()
