"""``show``, ``validate``, ``profiles`` and ``schema``: the configuration as loaded, checked,
bundled and committed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..config.loading import LoadedConfig, load_config
from ..config.selection import bundled_profiles
from ..errors import ConfigError, KVCRPolicyError
from .options import Format, PlainFormat, ProfileOpt, SetOpt, err, out, overrides, print_json

__all__ = ["profiles", "schema", "show", "toml_text", "validate"]


def show(
    profile: ProfileOpt = None,
    set_: SetOpt = None,
    format: Annotated[Format, typer.Option("--format", "-f")] = Format.table,
    env: Annotated[
        bool, typer.Option("--env", help="Add the environment variable of each key.")
    ] = False,
) -> None:
    """The effective configuration and where each value came from."""
    from ..backends.peer.credentials import secret_source

    loaded = load_config(profile=profile, overrides=overrides(set_))
    secret = secret_source(loaded)  # where the effective secret comes from, never the secret
    if format is Format.json:
        data = loaded.config.model_dump(mode="json")
        print_json({"config": data, "origins": dict(loaded.origins), "profile": loaded.profile,
                    "secret": {"value": secret[0], "from": secret[1]}})  # fmt: skip
        return
    if format is Format.toml:
        sys.stdout.write(toml_text(loaded))
        return
    from ..config.table import config_table

    out.print(config_table(loaded, env=env, notes={"security.secret": secret}))


# ---- the TOML writer: a loaded configuration as a profile, each value with its origin ----


def toml_text(loaded: LoadedConfig) -> str:
    """``loaded`` as TOML that loads as a profile, every value commented with its origin."""
    data = loaded.config.model_dump(mode="json")
    lines = [f"# profile: {loaded.profile or 'none (schema defaults)'}"]
    for section, values in data.items():
        lines.append(f"\n[{section}]")
        for key, value in values.items():
            if key == "options":
                continue
            origin = loaded.origins.get(f"{section}.{key}", "default")
            lines.append(_toml_line(key, value, origin))
        if values.get("options"):
            lines.append(f"\n[{section}.options]")
            for key, value in values["options"].items():
                origin = loaded.origins.get(f"{section}.options.{key}", "default")
                lines.append(_toml_line(key, value, origin))
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(str(value))


def _toml_line(key: str, value: Any, origin: str) -> str:
    # TOML has no null: an unset value is shown as a comment, so the output loads as a profile.
    if value is None:
        return f"# {key} is unset  # {origin}"
    return f"{key} = {_toml_value(value)}  # {origin}"


# ---- validate, profiles, schema ----------------------------------------------------------


def validate(
    profiles: Annotated[list[str] | None, typer.Argument(help="Profile names or paths.")] = None,
    set_: SetOpt = None,
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
) -> None:
    """Load each profile (with the environment and --set) and report every error; exit 2 on
    any.

    A tier (placement.capacity_bytes) larger than this host or its memory cgroup is an error."""
    from ..config.preflight import check_host_fit

    changes = overrides(set_)
    results = []
    for name in profiles or [None]:  # type: ignore[list-item]
        label = name or "environment + defaults"
        try:
            check_host_fit(load_config(profile=name, overrides=changes))
        except KVCRPolicyError as error:
            issues = error.issues if isinstance(error, ConfigError) else ()
            problems = [{"path": i.path, "origin": i.origin, "message": i.message} for i in issues]
            results.append({"profile": label, "ok": False, "error": str(error), "issues": problems})
        else:
            results.append({"profile": label, "ok": True, "error": None, "issues": []})
    failed = not all(result["ok"] for result in results)
    if format is PlainFormat.json:
        print_json({"ok": not failed, "profiles": results})
    else:
        for result in results:
            label = str(result["profile"])
            if result["ok"]:
                out.print(f"✓ {label}", markup=False)
            else:
                text = escape(str(result["error"]))
                err.print(f"[red]✗[/red] {escape(label)}: {text}", highlight=False)
    if failed:
        raise typer.Exit(2)


def profiles(
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
) -> None:
    """Bundled profiles and what each is for."""
    rows = []
    for name, path in bundled_profiles().items():
        header = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            header.append(line.lstrip("# ").strip())
        purpose = header[0].split("—", 1)[-1].strip() if header else ""
        rows.append({"name": name, "purpose": purpose, "path": str(path)})
    if format is PlainFormat.json:
        print_json(rows)
        return
    table = Table()
    table.add_column("profile")
    table.add_column("purpose")
    for row in rows:
        table.add_row(row["name"], row["purpose"])
    out.print(table)


def schema(
    write: Annotated[bool, typer.Option("--write", help="Regenerate schemas/.")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Verify schemas/ (exit 1 if stale).")
    ] = False,
    folder: Annotated[
        Path | None, typer.Option("--dir", help="Another schemas/ folder to write or check.")
    ] = None,
    tunable: Annotated[
        bool,
        typer.Option("--tunable", help="List the knobs `tune` searches, with their candidates."),
    ] = False,
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
) -> None:
    """Print, regenerate (--write) or verify (--check) the committed schemas."""
    from ..config.order import check_schemas, json_schema, write_schemas

    if tunable:
        _print_tunable()
        return
    if write:
        wrote = write_schemas(folder)
        if format is PlainFormat.json:
            print_json({"wrote": [str(path) for path in wrote]})
            return
        for path in wrote:
            out.print(f"wrote {path}")
        return
    if check:
        problems = check_schemas(folder)
        if format is PlainFormat.json:
            print_json({"ok": not problems, "problems": list(problems)})
            if problems:
                raise typer.Exit(1)
            return
        if problems:
            for problem in problems:
                err.print(f"✗ {problem}", highlight=False, markup=False)
            hint = (
                "Pinned fields never move, get renamed or disappear (integrators build these "
                "types positionally): put them back, append new fields at the end, then run "
                "`kvcr-policy schema --write` and commit schemas/."
            )
            err.print(hint, highlight=False, markup=False)
            raise typer.Exit(1)
        out.print("✓ schemas/ matches the code")
        return
    print_json(json_schema())


def _print_tunable() -> None:
    """Every tunable declaration: the schema's and each registered options model's."""
    from ..tune.space import declared_knobs

    registry = load_config().registry
    assert registry is not None  # every load_config result carries the registry it used
    print_json([declared.to_dict() for declared in declared_knobs(registry)])
