"""Overrides (``--set`` and the ``overrides`` argument): leaves given by the caller."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ...errors import ConfigIssue
from ..provenance import OVERRIDE

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover - exercised on Python 3.10 only
    pass

from .common import (
    Leaves,
    UnknownKeys,
    _check_path,
    _refuse_secret,
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
        checked = _check_path(path, OVERRIDE, known, unknown)
        issue = checked if checked is not True else _refuse_secret(path, OVERRIDE, "overrides")
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
