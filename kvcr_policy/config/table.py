"""The effective configuration as ``kvcr-policy show`` prints it: whole in 80 columns.

Rows are grouped by section (``[batching]``, then its keys without the section prefix); a key
is never cut, long values and origins wrap instead. Origins are shortened for reading: a
bundled profile by its name (``throughput [batching]``), a file by a short path (``./site.toml``,
``~/kvcr/site.toml``, ``…/kvcr/site.toml``), and a variable that is the key's own env name
(``KVCR_POLICY_`` + the path in capitals joined by ``__``) as plain ``env``: the names are
long and follow from the key; an alias (``KVCR_POLICY_PLUGINS``) is still named. The env name
of every key is a column on request (``--env``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from ..values import as_written
from .loading import LoadedConfig
from .selection import bundled_profiles
from .sources import env_name, flatten

__all__ = ["Row", "config_rows", "config_table", "short_origin", "short_path"]

_LONG_PATH = 40  # characters; longer paths are shown as their last two parts


@dataclass(frozen=True, slots=True)
class Row:
    """One effective value: its section, its key within the section, value, origin, env."""

    section: str
    key: str
    value: str
    origin: str
    env: str
    changed: bool


def short_path(path: str | os.PathLike[str], cwd: Path | None = None) -> str:
    """A bundled profile's name, else ``./rel`` under ``cwd``, ``~/rel`` under home, the path
    itself when short, else ``…/parent/name``."""
    given = Path(path)
    for name, bundled in bundled_profiles().items():
        if given == bundled:
            return name
    for base, mark in ((cwd or Path.cwd(), "."), (Path.home(), "~")):
        try:
            return f"{mark}/{given.relative_to(base)}"
        except ValueError:
            continue
    text = str(given)
    if len(text) <= _LONG_PATH or len(given.parts) <= 3:
        return text
    return "…/" + "/".join(given.parts[-2:])


def short_origin(origin: str, cwd: Path | None = None, env: str | None = None) -> str:
    """An origin (see :mod:`kvcr_policy.config.provenance`) with its file named briefly.

    ``profile <bundled> [t]`` becomes ``<name> [t]``; ``profile <file> [t]`` becomes
    ``profile <short path> [t]``; ``dotenv <file> NAME`` becomes ``dotenv <short path> NAME``;
    ``NAME`` is left out where it is ``env``, the key's own variable.
    """
    kind, _, rest = origin.partition(" ")
    if kind == "env" and rest == env:
        return "env"
    if kind == "profile" and rest.endswith("]") and " [" in rest:
        path, _, table = rest.rpartition(" [")
        short = short_path(path, cwd)
        named = short if short in bundled_profiles() else f"profile {short}"
        return f"{named} [{table}"
    if kind == "dotenv" and " " in rest:
        path, _, name = rest.rpartition(" ")
        named = "" if name == env else f" {name}"
        return f"dotenv {short_path(path, cwd)}{named}"
    return origin


def _value(path: str, value: Any, written: str | None = None) -> str:
    # Byte sizes read best as the size a profile would write: 16GiB, not 17179869184; one
    # given as text is echoed as written, its binary size beside it: 64GB (59.6 GiB).
    if path.endswith("_bytes") and isinstance(value, int) and not isinstance(value, bool):
        if written is not None:
            return as_written(written, value)
        for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if value >= 1 << shift and value % (1 << shift) == 0:
                return f"{value >> shift}{unit}"
    return json.dumps(value)


def config_rows(
    loaded: LoadedConfig,
    cwd: Path | None = None,
    notes: Mapping[str, tuple[str, str]] | None = None,
) -> list[Row]:
    """Every effective leaf of ``loaded`` (empty ``options`` tables left out), in order;
    ``notes`` gives a leaf's value and origin as they take effect (the peer secret's file)."""
    rows = []
    data: Mapping[str, Any] = loaded.config.model_dump(mode="json")
    for path, value in flatten(data).items():
        if isinstance(value, dict) and not value:
            continue
        section, _, key = path.partition(".")
        origin = loaded.origins.get(path, "default")
        env = env_name(path)
        shown, where = (notes or {}).get(path, (None, None))
        rows.append(
            Row(
                section=section,
                key=key,
                value=shown or _value(path, value, loaded.written.get(path)),
                origin=where or short_origin(origin, cwd, env),
                env=env,
                changed=origin != "default",
            )
        )
    return rows


def config_table(
    loaded: LoadedConfig,
    env: bool = False,
    cwd: Path | None = None,
    notes: Mapping[str, tuple[str, str]] | None = None,
) -> Table:
    """A rich table of :func:`config_rows`: section headings, keys whole, values and origins
    wrapped rather than cut; values set anywhere but the schema default in bold."""
    rows = config_rows(loaded, cwd, notes)
    profile = short_path(loaded.profile, cwd) if loaded.profile else "none (schema defaults)"
    table = Table(
        title=f"profile: {profile}",
        title_justify="left",
        caption=None if env else "env: from KVCR_POLICY_<SECTION>__<KEY>; --env names each",
        caption_justify="left",
        box=None,
        pad_edge=False,
    )
    width = max(len(row.key) for row in rows) + 2
    table.add_column("key", no_wrap=True, min_width=width)
    table.add_column("value", overflow="fold")
    table.add_column("origin", overflow="fold")
    if env:
        table.add_column("env", overflow="fold")
    section = None
    for row in rows:
        if row.section != section:
            section = row.section
            table.add_row(escape(f"[{section}]"), style="bold cyan")
        cells = [f"  {row.key}", escape(row.value), escape(row.origin)]
        if env:
            cells.append(row.env)
        table.add_row(*cells, style="bold" if row.changed else None)
    return table
