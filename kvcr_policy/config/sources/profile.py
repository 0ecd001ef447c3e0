"""A profile file (TOML): its leaves, each with the file and table it came from."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ...errors import ConfigIssue
from ...values import shorten
from ..provenance import profile_origin
from ..user_files import MAX_CONFIG_BYTES, FileRefused, parse_problem, read_regular

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from .common import (
    PROFILE_TABLE,
    Leaves,
    UnknownKeys,
    _leaf_issue,
    flatten,
    known_leaves,
)


def read_profile(path: Path) -> tuple[dict[str, Any], list[ConfigIssue]]:
    """The tables of the TOML file at ``path``, or the one problem that stops its reading.

    Read by :func:`~kvcr_policy.config.user_files.read_regular` (a regular file, at most
    :data:`~kvcr_policy.config.user_files.MAX_CONFIG_BYTES`), then parsed with ``tomllib``, as
    pydantic-settings' ``TomlConfigSettingsSource`` parses it; that source opens the path
    itself, which waits forever on a FIFO and reads a device to the end.
    """
    where = str(path)
    try:
        raw = read_regular(path, MAX_CONFIG_BYTES)
    except FileRefused as err:
        return {}, [ConfigIssue("<profile>", where, f"cannot read the profile: {err.reason}")]
    try:
        return tomllib.loads(raw.decode("utf-8")), []
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        issue = ConfigIssue("<profile>", where, f"not valid TOML: {shorten(parse_problem(err))}")
        return {}, [issue]
    except RecursionError:  # tomllib recurses once per nested array or inline table
        message = "not a profile: arrays or tables nested too deeply to read"
        return {}, [ConfigIssue("<profile>", where, message)]


def profile_source(path: Path) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values of one TOML profile, each with ``profile <path> [<table>]`` as origin."""
    where = str(path)
    data, problems = read_profile(path)
    if problems:
        return {}, problems
    known = known_leaves()
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    unknown = UnknownKeys()
    data = {key: value for key, value in data.items() if key != PROFILE_TABLE}
    for leaf, value in flatten(data).items():
        table = leaf.rsplit(".", 1)[0] if "." in leaf else "<top level>"
        origin = profile_origin(where, table)
        problem = _leaf_issue(leaf, origin, known, unknown, "a profile")
        if problem is not None:
            if problem is not False:
                issues.append(problem)
            continue
        leaves[leaf] = (value, origin)
    return leaves, issues + unknown.rest()
