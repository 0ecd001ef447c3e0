"""``plugins``: registered strategies, transports and backends by kind, who provides each, and
the plugins skipped."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from ..config.loading import load_config
from .options import PlainFormat, err, out, print_json

__all__ = ["plugins"]


def plugins(
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
) -> None:
    """Registered strategies and transports by kind, who provides them, and skipped plugins."""
    loaded = load_config()
    registry = loaded.registry
    assert registry is not None  # every load_config result carries the registry it used
    kinds = {
        kind: [
            {
                "name": s.name,
                "description": s.description,
                "plugin": s.plugin,
                "distribution": s.distribution,
                "version": s.version,
            }
            for s in specs
        ]
        for kind, specs in registry.by_kind().items()
    }
    skipped = [
        {"name": b.name, "distribution": b.distribution, "reason": b.reason, "blocked": b.blocked}
        for b in registry.broken
    ]
    if format is PlainFormat.json:
        print_json({"strategies": kinds, "skipped": skipped})
        return
    rows = [
        (kind, spec["name"], f"{spec['distribution']} {spec['version']} ({spec['plugin']})",
         escape(spec["description"]))
        for kind, specs in kinds.items()
        for spec in specs
    ]  # fmt: skip
    table = Table()
    for column in ("kind", "name", "provided by", "description"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    # Off a terminal (a pipe, a file) the table is as wide as it needs: at rich's default of 80
    # columns it cut names ("kvcr-policy-moonca…"), and nothing there wraps long lines.
    if out.is_terminal:
        out.print(table)
    else:
        wide = Measurement.get(out, out.options.update(max_width=10_000), table).maximum
        Console(width=wide, soft_wrap=True).print(table)
    for item in skipped:
        word = "blocked" if item["blocked"] else "broken"
        err.print(
            f"{word}: {item['name']} ({item['distribution']}): {item['reason']}", markup=False
        )
