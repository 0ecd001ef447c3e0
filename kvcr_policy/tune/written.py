"""The profile ``tune`` writes: a comment header with the evidence, ``[profile]`` naming the
base it extends and recording the measurement, then only the values that differ from the base.

Written by hand rather than with a TOML writer: the header is comments, which TOML writers do
not emit, and the values are a few scalars in a few tables.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..config.schema import PolicyConfig
from ..config.sources import PROFILE_TABLE

__all__ = ["render_profile", "spell"]


def spell(value: Any) -> str:
    """``value`` as a TOML value (no null: callers leave unset values out)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"TOML cannot hold {value!r} here")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, Mapping):
        items = ", ".join(f"{json.dumps(str(k))} = {spell(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(spell(v) for v in value) + "]"
    raise ValueError(f"TOML cannot hold {value!r}")


def _tables(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Dotted paths -> ``{table: {key: value}}`` in the schema's section order."""
    order = {name: i for i, name in enumerate(PolicyConfig.model_fields)}
    tables: dict[str, dict[str, Any]] = {}
    for path in sorted(values, key=lambda p: (order.get(p.split(".")[0], 99), p.count("."), p)):
        table, _, key = path.rpartition(".")
        tables.setdefault(table, {})[key] = values[path]
    return tables


def render_profile(
    *,
    base: str,
    values: Mapping[str, Any],
    header: Sequence[str] = (),
    record: Mapping[str, Any] | None = None,
) -> str:
    """The text of a profile that extends ``base`` with ``values`` (dotted paths)."""
    lines = [f"# {line}".rstrip() for line in header]
    if lines:
        lines.append("")
    lines += [f"[{PROFILE_TABLE}]", f"base = {spell(base)}"]
    if record:
        lines += ["", f"[{PROFILE_TABLE}.tune]"]
        lines += [f"{key} = {spell(value)}" for key, value in record.items() if value is not None]
    for table, items in _tables(values).items():
        lines += ["", f"[{table}]"]
        lines += [f"{key} = {spell(value)}" for key, value in items.items()]
    return "\n".join(lines) + "\n"
