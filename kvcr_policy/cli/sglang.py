"""``kvcr-policy sglang-config``: the ``--hicache-storage-backend-extra-config`` for a profile.

Without ``--check`` it prints, on one line, the JSON object that loads this backend through
SGLang's dynamic loader with the profile and overrides given, after loading them exactly as the
backend will (a typo exits 2 with one message, here instead of at SGLang's start)::

    kvcr-policy sglang-config --profile throughput --set placement.capacity_bytes=64GiB

``--check VALUE`` reads a flag value the way SGLang reads it (JSON text or ``@FILE``) and checks
it the way SGLang's loader and the backend will: bad JSON, an unreadable file, a loader key
missing or naming another backend, an unknown key, a profile that does not load or a tier
(``placement.capacity_bytes``) larger than this host or its memory cgroup exit 2 with one
message; a good value prints what the backend will run with. With ``--tp`` (``--pp``) and
``--mla`` it is checked as one rank of that engine loads it: for an MLA model at TP > 1
``auto`` is the host tier (one for every rank), and a tier private to each rank exits 2 with
the fix. SGLang imports nothing here: this runs on a machine without it.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Annotated, Any

import typer

from ...cli_help import JsonOnly
from ...errors import ConfigError, ConfigIssue
from ...loading import load_config
from ...preflight import check_host_fit
from ...values import shorten
from .config import EXTRA_CONFIG_ORIGIN, LOADER_KEYS, extra_config_for, parse_extra_config
from .flag import read_flag
from .startup import load

__all__ = ["MODULES", "register", "sglang_config_command"]

#: The modules SGLang's loader may import this backend's class from (the package re-exports it).
MODULES = ("kvcr_policy.integrations.sglang", "kvcr_policy.integrations.sglang.storage")


def _pairs(pairs: list[str] | None) -> dict[str, str]:
    result: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {pair!r}", param_hint="--set")
        result[key.strip()] = value
    return result


def _loader_issues(extra: dict[str, Any]) -> list[ConfigIssue]:
    """Why SGLang's dynamic loader would not build this backend from ``extra``: it needs
    ``backend_name``, ``module_path`` and ``class_name``, imports the module and takes the
    class from it (``StorageBackendFactory._create_dynamic_backend``)."""
    issues = []
    for key in ("backend_name", "module_path", "class_name"):
        if key not in extra:
            message = f"missing; SGLang's dynamic loader needs it: {key!r}: {LOADER_KEYS[key]!r}"
            issues.append(ConfigIssue(f"extra_config.{key}", EXTRA_CONFIG_ORIGIN, message))
    for key, accepted in (("module_path", MODULES), ("class_name", (LOADER_KEYS["class_name"],))):
        if key in extra and extra[key] not in accepted:
            message = (
                f"SGLang would load {shorten(extra[key])}, not this backend; expected "
                f"{LOADER_KEYS[key]!r}"
            )
            issues.append(ConfigIssue(f"extra_config.{key}", EXTRA_CONFIG_ORIGIN, message))
    return issues


def _check(value: str, tp: int = 1, pp: int = 1, mla: bool = False) -> dict[str, Any]:
    extra = read_flag(value)
    issues = _loader_issues(extra)
    try:
        options = parse_extra_config(extra)
    except ConfigError as err:  # every problem of the flag at once
        raise ConfigError([*issues, *err.issues], title="SGLang would not load this") from None
    if issues:
        raise ConfigError(issues, title="SGLang would not load this backend with this flag")
    rank = SimpleNamespace(tp_size=tp, pp_size=pp, attn_cp_size=1, is_mla_model=mla)
    loaded = load(options, rank)
    check_host_fit(loaded)  # a tier larger than this host: exit 2 here, not killed at start
    return {
        "loads": True,
        "interface_v1": options.interface_v1,
        "profile": loaded.profile or "default",
        "backend": {"name": loaded.config.backend.name, "from": loaded.origin("backend.name")},
        "changed": {path: {"value": v, "from": o} for path, (v, o) in loaded.changed().items()},
    }


def sglang_config_command(
    profile: Annotated[
        str | None,
        typer.Option("--profile", "-p", help="Bundled profile name or path for the backend."),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="An override the backend applies: KEY=VALUE."),
    ] = None,
    check: Annotated[
        str | None,
        typer.Option(
            "--check",
            help="Check a flag value (JSON text or @FILE) as SGLang and the backend read it.",
        ),
    ] = None,
    tp: Annotated[
        int, typer.Option("--tp", min=1, max=4096, help="--check as a rank of this TP size.")
    ] = 1,
    pp: Annotated[
        int, typer.Option("--pp", min=1, max=4096, help="--check as a rank of this PP size.")
    ] = 1,
    mla: Annotated[bool, typer.Option("--mla", help="--check for an MLA model.")] = False,
    format: Annotated[
        JsonOnly, typer.Option("--format", "-f", help="Both the value and a check are JSON.")
    ] = JsonOnly.json,
) -> None:
    """Print the SGLang --hicache-storage-backend-extra-config for a profile, or check one."""
    if check is not None:
        result = _check(check, tp, pp, mla)
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
        return
    overrides = _pairs(set_)
    load_config(profile, None, overrides)  # as the backend will: fail here, not at start
    sys.stdout.write(json.dumps(extra_config_for(profile, overrides)) + "\n")


def register(app: typer.Typer) -> None:
    app.command("sglang-config")(sglang_config_command)
