"""The ``[profile]`` table of a profile file: the base profile it extends, and what
``kvcr-policy tune`` recorded about the measurement that wrote it.

::

    [profile]
    base = "throughput"     # a bundled name, or a path (relative to this file's folder)

    [profile.tune]          # written by `kvcr-policy tune`; `tune --remeasure` repeats it
    target = "cpu"
    geometry = "small"

The table describes the file and sets no configuration value. A profile's values override
those of its base, which may extend another in turn; every value keeps the file it was read
from as its origin (``profile /path/site.toml [batching]`` or ``profile .../throughput.toml
[batching]``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, ConfigIssue
from .provenance import profile_origin
from .sources import PROFILE_TABLE, read_profile, suggest

__all__ = ["MAX_BASES", "PROFILE_KEYS", "ProfileMeta", "base_chain", "read_meta"]

#: Keys of the ``[profile]`` table and what each holds.
PROFILE_KEYS: dict[str, str] = {
    "base": "the profile this one extends: a bundled name or a path relative to this file",
    "tune": "the measurement `kvcr-policy tune` wrote this file from (a table)",
}
#: Most profiles one chain of bases may hold: deeper is surely a mistake.
MAX_BASES = 8

Resolve = Callable[[str, Path, str], Path]


@dataclass(frozen=True)
class ProfileMeta:
    """What a ``[profile]`` table says: the base, and tune's record (empty when absent)."""

    base: str | None = None
    tune: Mapping[str, Any] = field(default_factory=dict)


def read_meta(path: Path) -> tuple[ProfileMeta, list[ConfigIssue]]:
    """The ``[profile]`` table of ``path``, checked.

    A file that cannot be read or is not TOML gives an empty table and no problem here: the
    profile source reports it, once.
    """
    data, problems = read_profile(path)
    if problems:
        return ProfileMeta(), []
    table = data.get(PROFILE_TABLE)
    if table is None:
        return ProfileMeta(), []
    where = profile_origin(str(path), PROFILE_TABLE)
    if not isinstance(table, dict):
        message = (
            f'expected a table ([{PROFILE_TABLE}] with base = "NAME"), got {type(table).__name__}'
        )
        return ProfileMeta(), [ConfigIssue(PROFILE_TABLE, where, message)]
    issues = []
    for key in table:
        if key not in PROFILE_KEYS:
            nearest = suggest(key, list(PROFILE_KEYS))
            hint = f"; did you mean {nearest!r}?" if nearest else ""
            message = f"unknown key{hint} (valid: {', '.join(PROFILE_KEYS)})"
            issues.append(ConfigIssue(f"{PROFILE_TABLE}.{key}", where, message))
    base = table.get("base")
    if base is not None and (not isinstance(base, str) or not base.strip()):
        message = f"expected a bundled profile name or a path, got {base!r}"
        issues.append(ConfigIssue(f"{PROFILE_TABLE}.base", where, message))
        base = None
    tune = table.get("tune", {})
    if not isinstance(tune, dict):
        message = f"expected a table ([{PROFILE_TABLE}.tune]), got {type(tune).__name__}"
        issues.append(ConfigIssue(f"{PROFILE_TABLE}.tune", where, message))
        tune = {}
    return ProfileMeta(base=base, tune=tune), issues


def base_chain(path: Path, resolve: Resolve) -> tuple[list[Path], list[ConfigIssue]]:
    """``path``, its base, that base's base, ...: every file whose values the profile holds.

    ``resolve(name, folder, where)`` turns a base's name into its file (a bundled name, or a
    path taken relative to ``folder``) or raises :class:`ConfigError`. A cycle, a chain longer
    than :data:`MAX_BASES` or a base that cannot be found is a problem naming the file.
    """
    chain = [path]
    issues: list[ConfigIssue] = []
    while True:
        current = chain[-1]
        meta, found = read_meta(current)
        issues += found
        if meta.base is None:
            return chain, issues
        where = profile_origin(str(current), PROFILE_TABLE)
        try:
            base = resolve(meta.base, current.parent, where)
        except ConfigError as err:
            return chain, issues + list(err.issues)
        if base in chain:
            cycle = " -> ".join(str(p) for p in [*chain[chain.index(base) :], base])
            message = f"profiles extend each other in a cycle: {cycle}; remove one base"
            return chain, [*issues, ConfigIssue(f"{PROFILE_TABLE}.base", where, message)]
        if len(chain) >= MAX_BASES:
            message = f"more than {MAX_BASES} profiles extend one another; flatten the chain"
            return chain, [*issues, ConfigIssue(f"{PROFILE_TABLE}.base", where, message)]
        chain.append(base)
