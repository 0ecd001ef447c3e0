"""A profile file (TOML): its leaves, each with the file and table it came from."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

from pydantic_settings import (
    TomlConfigSettingsSource,
)

from ..errors import ConfigIssue
from ..provenance import profile_origin
from ..values import shorten

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from .common import (
    PROFILE_TABLE,
    Leaves,
    PolicySettings,
    _check_path,
    _refuse_secret,
    flatten,
    known_leaves,
)


def profile_source(path: Path) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values of one TOML profile, each with ``profile <path> [<table>]`` as origin."""
    where = str(path)
    if not path.is_file():  # pydantic-settings skips a missing file; a chosen profile must exist
        reason = os.strerror(errno.EISDIR if path.is_dir() else errno.ENOENT)
        return {}, [ConfigIssue("<profile>", where, f"cannot read the profile: {reason}")]
    try:
        data = TomlConfigSettingsSource(PolicySettings, toml_file=path)()
    except OSError as err:
        issue = ConfigIssue("<profile>", where, f"cannot read the profile: {err.strerror}")
        return {}, [issue]
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        issue = ConfigIssue("<profile>", where, f"not valid TOML: {shorten(str(err))}")
        return {}, [issue]
    except RecursionError:  # tomllib recurses once per nested array or inline table
        message = "not a profile: arrays or tables nested too deeply to read"
        return {}, [ConfigIssue("<profile>", where, message)]
    known = known_leaves()
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    data = {key: value for key, value in data.items() if key != PROFILE_TABLE}
    for leaf, value in flatten(data).items():
        table = leaf.rsplit(".", 1)[0] if "." in leaf else "<top level>"
        origin = profile_origin(where, table)
        problem = _check_path(leaf, origin, known) or _refuse_secret(leaf, origin, "a profile")
        if problem is not None:
            issues.append(problem)
            continue
        leaves[leaf] = (value, origin)
    return leaves, issues
