"""Overrides (``--set`` and the ``overrides`` argument): leaves given by the caller."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import ConfigIssue
from ..provenance import OVERRIDE
from .common import (
    Leaves,
    UnknownKeys,
    _leaf_issue,
    echo,
    flatten,
    known_leaves,
)
from .env import (
    _decode,
)


def override_source(overrides: Mapping[str, Any]) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values given by the caller, nested or as dotted paths; strings parse as in env."""
    known = known_leaves()
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        nested.update({key: value} if "." in key else flatten({key: value}))
    unknown = UnknownKeys()
    for path, value in nested.items():
        issue = _leaf_issue(path, OVERRIDE, known, unknown, "overrides")
        if issue is not None:
            if issue is not False:
                issues.append(issue)
            continue
        if isinstance(value, str):
            try:
                value = _decode(value, known.get(path, Any))
            except ValueError as err:
                issues.append(
                    ConfigIssue(path, OVERRIDE, f"cannot parse {echo(path, value)}: {err}")
                )
                continue
        leaves[path] = (value, OVERRIDE)
    return leaves, issues + unknown.rest()
