"""kvcr-policy: thin commands over load_config, make_plugin_manager, the contract and the engine.

Errors print one clear message on stderr and exit 2 (schema drift and a failed regression
screen exit 1); a traceback is a bug.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .backends.peer.cli import register as _register_peer
from .cli_geometry import geometry_options
from .cli_help import PlainGroup, plain_help, version_callback
from .cli_numbers import (
    MAX_BLOCK_TOKENS,
    MAX_BUDGET_S,
    MAX_BYTES_REQUESTS,
    MAX_HOLD_S,
    MAX_LINK_GBPS,
    MAX_RANKS,
    MAX_REPEAT,
    MAX_SEED,
    MAX_TOKENS,
    MIN_BUDGET_S,
    MIN_LINK_GBPS,
    Finite,
    RateOption,
)
from .errors import ConfigError, KVCRPolicyError
from .integrations.sglang.cli import register as _register_sglang
from .loading import LoadedConfig, bundled_profiles, load_config, profile_or
from .model_shape import ShapeOptions
from .replay.cli import register as _register_replay
from .values import parse_size, shorten

__all__ = ["app", "main"]

#: The pool layouts, listed in each --layout's help (geometry.LAYOUTS, without its import cost).
LAYOUT_HELP = "layer_first, page_first, page_first_direct or page_head."

app = typer.Typer(
    name="kvcr-policy",
    cls=PlainGroup,
    help="Delivery and placement policies for KV-cache storage tiers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console(soft_wrap=True)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=version_callback,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Delivery and placement policies for KV-cache storage tiers."""


err = Console(stderr=True, soft_wrap=True)


class Format(str, Enum):
    table = "table"
    json = "json"
    toml = "toml"


class PlainFormat(str, Enum):
    table = "table"
    json = "json"


ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile", "-p", help="Bundled profile name or path (else KVCR_POLICY_PROFILE)."
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override one value (repeatable)."),
]


def _overrides(pairs: list[str] | None) -> dict[str, str]:
    result: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {shorten(pair)}", param_hint="--set")
        result[key.strip()] = value
    return result


def _load(profile: str | None, pairs: list[str] | None) -> LoadedConfig:
    return load_config(profile=profile, overrides=_overrides(pairs))


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


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


@app.command()
def show(
    profile: ProfileOpt = None,
    set_: SetOpt = None,
    format: Annotated[Format, typer.Option("--format", "-f")] = Format.table,
    env: Annotated[
        bool, typer.Option("--env", help="Add the environment variable of each key.")
    ] = False,
) -> None:
    """The effective configuration and where each value came from."""
    loaded = _load(profile, set_)
    data = loaded.config.model_dump(mode="json")
    if format is Format.json:
        _print_json({"config": data, "origins": dict(loaded.origins), "profile": loaded.profile})
        return
    if format is Format.toml:
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
        sys.stdout.write("\n".join(lines) + "\n")
        return
    from .config_table import config_table

    out.print(config_table(loaded, env=env))


@app.command()
def validate(
    profiles: Annotated[list[str] | None, typer.Argument(help="Profile names or paths.")] = None,
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
) -> None:
    """Load each profile (with the environment) and report every error; exit 2 on any.

    A tier (placement.capacity_bytes) larger than this host or its memory cgroup is an error."""
    from .preflight import check_host_fit

    results = []
    for name in profiles or [None]:  # type: ignore[list-item]
        label = name or "environment + defaults"
        try:
            check_host_fit(load_config(profile=name))
        except KVCRPolicyError as error:
            issues = error.issues if isinstance(error, ConfigError) else ()
            problems = [{"path": i.path, "origin": i.origin, "message": i.message} for i in issues]
            results.append({"profile": label, "ok": False, "error": str(error), "issues": problems})
        else:
            results.append({"profile": label, "ok": True, "error": None, "issues": []})
    failed = not all(result["ok"] for result in results)
    if format is PlainFormat.json:
        _print_json({"ok": not failed, "profiles": results})
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


@app.command()
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
        _print_json(rows)
        return
    table = Table()
    table.add_column("profile")
    table.add_column("purpose")
    for row in rows:
        table.add_row(row["name"], row["purpose"])
    out.print(table)


@app.command()
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
    from .contract import check_schemas, json_schema, write_schemas

    if tunable:
        _print_tunable()
        return
    if write:
        wrote = write_schemas(folder)
        if format is PlainFormat.json:
            _print_json({"wrote": [str(path) for path in wrote]})
            return
        for path in wrote:
            out.print(f"wrote {path}")
        return
    if check:
        problems = check_schemas(folder)
        if format is PlainFormat.json:
            _print_json({"ok": not problems, "problems": list(problems)})
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
    _print_json(json_schema())


def _print_tunable() -> None:
    """Every tunable declaration: the schema's and each registered options model's."""
    from .tune.space import declared_knobs

    registry = load_config().registry
    assert registry is not None  # every load_config result carries the registry it used
    _print_json([declared.to_dict() for declared in declared_knobs(registry)])


@app.command()
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
        _print_json({"strategies": kinds, "skipped": skipped})
        return
    table = Table()
    for column in ("kind", "name", "provided by", "description"):
        table.add_column(column)
    for kind, specs in kinds.items():
        for spec in specs:
            provider = f"{spec['distribution']} {spec['version']} ({spec['plugin']})"
            table.add_row(kind, spec["name"], provider, escape(spec["description"]))
    out.print(table)
    for item in skipped:
        word = "blocked" if item["blocked"] else "broken"
        err.print(
            f"{word}: {item['name']} ({item['distribution']}): {item['reason']}", markup=False
        )


@app.command()
@geometry_options
def plan(
    tokens: Annotated[
        int | None,
        typer.Option("--tokens", min=1, max=MAX_TOKENS, help="Tokens the tier should hold."),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option("--trace", help="Replay a request trace (Mooncake's JSON lines) instead."),
    ] = None,
    capacity_tokens: Annotated[
        str | None,
        typer.Option(
            "--capacity-tokens",
            help="--trace: tier capacities to replay, e.g. 1000000,3M,10M (default: the "
            "profile's tier).",
        ),
    ] = None,
    block_tokens: Annotated[
        int | None,
        typer.Option(
            "--block-tokens",
            min=1,
            max=MAX_BLOCK_TOKENS,
            help="--trace: tokens per hash id (Mooncake's: 512).",
        ),
    ] = None,
    eviction: Annotated[
        str | None,
        typer.Option("--eviction", help="--trace: eviction strategies, e.g. lru,fifo."),
    ] = None,
    bytes_requests: Annotated[
        int | None,
        typer.Option(
            "--bytes",
            min=1,
            max=MAX_BYTES_REQUESTS,
            help="--trace: also store and restore real pages for the first N requests.",
        ),
    ] = None,
    plot: Annotated[
        str | None, typer.Option("--plot", help="--trace: draw hit rate against capacity here.")
    ] = None,
    profile: ProfileOpt = None,
    set_: SetOpt = None,
    layout: Annotated[str, typer.Option("--layout", help=LAYOUT_HELP)] = "layer_first",
    pp: Annotated[
        int | None, typer.Option("--pp", min=1, max=MAX_RANKS, help="Pipeline-parallel size.")
    ] = None,
    ranks_per_host: Annotated[
        int | None, typer.Option("--ranks-per-host", min=1, max=MAX_RANKS, help="Default: tp x pp.")
    ] = None,
    pools: Annotated[
        int | None, typer.Option("--pools", min=1, max=MAX_RANKS, help="Pools per rank.")
    ] = None,
    prefix_tokens: Annotated[
        int | None,
        typer.Option(
            "--prefix-tokens", min=1, max=MAX_TOKENS, help="Restore plan for this prefix."
        ),
    ] = None,
    host_memory: Annotated[
        str | None, typer.Option("--host-memory", help="e.g. 2TiB; default: this machine's.")
    ] = None,
    link_gbps: Annotated[
        float | None,
        typer.Option(
            "--link-limit",
            parser=RateOption(MIN_LINK_GBPS, MAX_LINK_GBPS),
            help="Link limit for the predicted time, with its unit: e.g. 50GB/s, 400Gbit/s.",
        ),
    ] = None,
    link_gbps_alias: Annotated[
        float | None,
        typer.Option(
            "--link-gbps",
            parser=RateOption(MIN_LINK_GBPS, MAX_LINK_GBPS),
            hidden=True,
            help="The former name of --link-limit; it takes the same rate with its unit.",
        ),
    ] = None,
    measure_link: Annotated[
        bool, typer.Option("--measure-link", help="Measure the link limit here with a probe.")
    ] = False,
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
    *,
    shape: ShapeOptions,
) -> None:
    """Sizing before deploying: tier memory per rank and host, and the restore of a prefix;
    or, with --trace, the hit rate each tier capacity buys on a real request trace.

    Exit 2 when the plan cannot work (each reason names the value and where it came from);
    exit 1 when a --bytes replay differs from the model.
    """
    from .plan.command import run_command

    run_command(
        tokens=tokens,
        trace=trace,
        block_tokens=block_tokens,
        capacity_tokens=capacity_tokens,
        eviction=eviction,
        bytes_requests=bytes_requests,
        plot=plot,
        profile=profile,
        overrides=_overrides(set_),
        shape=shape,
        layout=layout,
        pp=pp,
        ranks_per_host=ranks_per_host,
        pools=pools,
        prefix_tokens=prefix_tokens,
        host_memory=_parse_size(host_memory, "--host-memory") if host_memory else None,
        link_gbps=link_gbps if link_gbps is not None else link_gbps_alias,
        measure_link=measure_link,
        json_format=format is PlainFormat.json,
    )


class Target(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class Via(str, Enum):
    local = "local"
    ucx = "ucx"


class Peer(str, Enum):
    hicache_file = "hicache-file"
    sglang_mooncake = "sglang-mooncake"


def _parse_size(text: str, option: str = "--size") -> int:
    from .schema import MAX_TIER_BYTES

    # The same rule and bound as placement.capacity_bytes, the size of a real tier region.
    return parse_size(text, what=option, high=MAX_TIER_BYTES)


@app.command()
def audit(
    profile: ProfileOpt = None,
    set_: SetOpt = None,
    size: Annotated[str, typer.Option("--size", help="Region size to open, e.g. 1GiB.")] = "1GiB",
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
) -> None:
    """Open a tier region as the profile places it and report where its pages really landed."""
    from .memory.audit_text import format_audit
    from .memory.preflight import TierRequest, check_tier, mapped_bytes

    loaded = _load(profile, set_)
    config = loaded.config
    registry = loaded.registry
    assert registry is not None  # every load_config result carries the registry it used
    spec = registry.get("placement", config.placement.strategy)
    placement = spec.create(config.placement, options=config.placement.options)
    nbytes = _parse_size(size)
    request = TierRequest("the audited region", mapped_bytes(nbytes), config.placement.prefault)
    check_tier(request, nbytes, "the command line", setting="--size")  # not killed: refused
    region = placement.open_region("audit", nbytes)
    try:
        result = region.audit()
    finally:
        region.close()
    if format is PlainFormat.json:
        _print_json({"profile": loaded.profile, "audit": result.to_dict()})
    else:
        out.print(format_audit(result), markup=False, highlight=False)


@app.command()
@geometry_options
def bench(
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            "-p",
            help="Profile measured (P): a bundled name or a path (else KVCR_POLICY_PROFILE, "
            "else throughput).",
        ),
    ] = None,
    vs: Annotated[str, typer.Option("--vs", help="Baseline profile (Q).")] = "default",
    layout: Annotated[str, typer.Option("--layout", help=LAYOUT_HELP)] = "layer_first",
    tokens: Annotated[int, typer.Option("--tokens", min=1, max=MAX_TOKENS)] = 8192,
    target: Annotated[Target, typer.Option("--target")] = Target.cpu,
    transport: Annotated[
        Via, typer.Option("--transport", help="local tier, or ucx: the same as --backend peer.")
    ] = Via.local,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend",
            help="Tier backend: dram, peer, kvcr or mooncake (default: the profile's).",
        ),
    ] = None,
    peer: Annotated[
        Peer | None,
        typer.Option(
            "--peer", help="Compare P with SGLang's HiCacheFile or its own Mooncake backend."
        ),
    ] = None,
    ucx_tls: Annotated[str, typer.Option("--ucx-tls", help="auto, sm or tcp.")] = "auto",
    repeat: Annotated[int, typer.Option("--repeat", min=1, max=MAX_REPEAT)] = 5,
    scatter: Annotated[
        bool, typer.Option("--scatter", help="Store in a random order: scattered tier slots.")
    ] = False,
    set_: SetOpt = None,
    screen_pct: Annotated[
        float | None,
        typer.Option(
            "--screen",
            parser=Finite(0, 100, "%"),
            help="Exit 1 if P is this % below Q in either order (0..100).",
        ),
    ] = None,
    sweep: Annotated[
        bool,
        typer.Option("--sweep", help="Run every page shape of the target's matrix: one table."),
    ] = False,
    plot: Annotated[str | None, typer.Option("--plot", help="Write a PNG of every run.")] = None,
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
    vs_set: Annotated[
        list[str] | None,
        typer.Option(
            "--vs-set",
            help="Override one value of Q only, after --set (repeatable).",
        ),
    ] = None,
    metrics: Annotated[
        str | None,
        typer.Option("--metrics", help="Serve /metrics on HOST:PORT (a bare PORT: loopback)."),
    ] = None,
    metrics_hold: Annotated[
        float | None,
        typer.Option(
            "--metrics-hold",
            parser=Finite(0, MAX_HOLD_S, "s"),
            help="Seconds /metrics stays up after the run (default: until interrupted).",
        ),
    ] = None,
    ranks: Annotated[
        int,
        typer.Option(
            "--ranks",
            min=1,
            max=MAX_RANKS,
            help="Tensor-parallel ranks: one process each (one GPU each on cuda), all restoring "
            "their shards at once.",
        ),
    ] = 1,
    devices: Annotated[
        str | None,
        typer.Option(
            "--devices",
            help="cuda: the GPU of each rank, e.g. 0,0 (two ranks on GPU 0) or 0,1; one index "
            "per rank. Default: rank r on GPU r.",
        ),
    ] = None,
    *,
    shape: ShapeOptions,
) -> None:
    """Store and restore KV pages with two profiles; ratios to limits measured in the same run."""
    options = dict(locals(), set_=_overrides(set_), vs_set=_overrides(vs_set))
    options["profile"] = profile_or(profile, "throughput")
    from .bench.command import run_command

    run_command(**options)


@app.command()
@geometry_options
def tune(
    start: Annotated[
        str | None,
        typer.Option(
            "--profile",
            "-p",
            "--from",
            help="Starting profile, the base the result extends (else KVCR_POLICY_PROFILE, "
            "else throughput).",
        ),
    ] = None,
    target: Annotated[Target, typer.Option("--target")] = Target.cpu,
    backend: Annotated[
        str | None,
        typer.Option(
            "--backend", help="Tier backend: dram, peer, kvcr or mooncake (default: the profile's)."
        ),
    ] = None,
    layout: Annotated[str, typer.Option("--layout", help=LAYOUT_HELP)] = "layer_first",
    tokens: Annotated[int, typer.Option("--tokens", min=1, max=MAX_TOKENS)] = 8192,
    scatter: Annotated[
        bool, typer.Option("--scatter", help="Store in a random order: scattered tier slots.")
    ] = False,
    set_: SetOpt = None,
    budget: Annotated[
        float,
        typer.Option(
            "--budget",
            parser=Finite(MIN_BUDGET_S, MAX_BUDGET_S, "s"),
            help="Seconds for the whole run, confirmation included (1..604800).",
        ),
    ] = 300.0,
    repeat: Annotated[
        int,
        typer.Option(
            "--repeat",
            min=1,
            max=MAX_REPEAT,
            help="Repeats per order confirming (and --remeasure).",
        ),
    ] = 9,
    trial_repeat: Annotated[
        int,
        typer.Option(
            "--trial-repeat", min=1, max=MAX_REPEAT, help="Repeats per order of each trial."
        ),
    ] = 3,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Search only this knob (repeatable).")
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", min=0, max=MAX_SEED, help="The sampler's seed.")
    ] = 0,
    write: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="PATH", help="Write the profile here if it wins."),
    ] = None,
    always_write: Annotated[
        bool,
        typer.Option("--output-always", help="Write the best candidate even if it loses."),
    ] = False,
    check_path: Annotated[
        Path | None,
        typer.Option(
            "--remeasure", metavar="PATH", help="Re-measure a written profile against its base."
        ),
    ] = None,
    format: Annotated[PlainFormat, typer.Option("--format", "-f")] = PlainFormat.table,
    write_alias: Annotated[Path | None, typer.Option("--write", hidden=True)] = None,
    always_alias: Annotated[bool, typer.Option("--always-write", hidden=True)] = False,
    check_alias: Annotated[Path | None, typer.Option("--check", hidden=True)] = None,
    *,
    shape: ShapeOptions,
) -> None:
    """Search the tunable knobs on this host; write the profile only if it wins."""
    options = dict(locals(), set_=_overrides(set_))  # every option above, by name
    options["start"] = profile_or(start, "throughput")
    # The former spellings, kept hidden: --write, --always-write and --check read like
    # `schema --write/--check` (regenerate, verify in place) but took a path and measured.
    options["write"] = _either(write, options.pop("write_alias"), "--output", "--write")
    options["always_write"] = always_write or options.pop("always_alias")
    options["check_path"] = _either(
        check_path, options.pop("check_alias"), "--remeasure", "--check"
    )
    from .tune.command import run_command

    run_command(**options)


def _either(value: Any, alias: Any, name: str, former: str) -> Any:
    """An option's value, given by its name or by its former (hidden) name, not both."""
    if value is not None and alias is not None:
        message = f"{former} is the former name of {name}: give {name} once"
        raise typer.BadParameter(message, param_hint=name)
    return alias if value is None else value


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors exit 2 with one message on stderr."""
    try:
        # Not standalone, so our errors print our way; click then *returns* the code of a
        # typer.Exit raised by a command (validate, schema --check) instead of raising it.
        code = app(args=argv, standalone_mode=False)
    except KVCRPolicyError as error:
        err.print(f"kvcr-policy: {error}", markup=False, highlight=False)
        sys.exit(2)
    except typer.Exit as stop:
        sys.exit(stop.exit_code)
    except typer.Abort:
        err.print("aborted", markup=False)
        sys.exit(130)
    except Exception as error:
        # click's usage errors arrive here in non-standalone mode. Recent typer vendors click
        # (typer._click), so `click.ClickException` does not match them: test the shape instead.
        exit_code = getattr(error, "exit_code", None)
        if callable(getattr(error, "show", None)) and isinstance(exit_code, int):
            error.show()  # type: ignore[attr-defined]
            sys.exit(exit_code)
        raise
    if isinstance(code, int) and code:
        sys.exit(code)


# `serve` lives with the peer tier it runs.
_register_peer(app)
_register_sglang(app)
_register_replay(app)
plain_help(app)
