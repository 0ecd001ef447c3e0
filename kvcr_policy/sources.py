"""Configuration sources: each turns one input into flat leaf values with their origins.

A source returns ``{leaf path: (raw value, origin)}`` plus the problems it found; loading merges
the sources in precedence order and validates once. Keeping sources separate (as
pydantic-settings does, one provider per source) is what lets every value remember who set it.
"""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, get_args, get_origin

from pydantic import BaseModel

from .errors import ConfigIssue
from .provenance import OVERRIDE, env_origin, profile_origin
from .schema import ENV_PREFIX, PolicyConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "RESERVED_ENV",
    "Leaves",
    "env_name",
    "env_source",
    "flatten",
    "known_leaves",
    "override_source",
    "profile_source",
    "suggest",
]

#: Leaf path -> (raw value, origin).
Leaves = dict[str, tuple[Any, str]]

#: KVCR_POLICY_* variables that are not config fields, with what they do.
RESERVED_ENV: dict[str, str] = {
    "PROFILE": "selects the profile: a bundled name or a path",
    "TRACE_HOOKS": "1 prints every plugin hook call",
    "PROC_ROOT": "reads /proc from another root (tests)",
    "SYS_ROOT": "reads /sys from another root (tests)",
}

#: Variables that feed one config field under a name of their own (issue: plugins allow/block).
ALIASED_ENV: dict[str, str] = {
    "PLUGINS": "plugins.allow",
    "DISABLE_PLUGINS": "plugins.block",
}

_OPTIONS = "options"


def _model_fields(model: type[BaseModel]) -> Iterator[tuple[str, Any]]:
    for name, field in model.model_fields.items():
        yield name, field.annotation


def known_leaves(model: type[BaseModel] = PolicyConfig, prefix: str = "") -> dict[str, Any]:
    """Every leaf path of the schema with its annotation; ``options`` tables are open leaves."""
    leaves: dict[str, Any] = {}
    for name, annotation in _model_fields(model):
        path = f"{prefix}{name}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            leaves.update(known_leaves(annotation, path + "."))
        else:
            leaves[path] = annotation
    return leaves


def env_name(path: str) -> str:
    """The environment variable that sets ``path``: ``KVCR_POLICY_`` + parts joined by ``__``."""
    for alias, target in ALIASED_ENV.items():
        if target == path:
            return ENV_PREFIX + alias
    return ENV_PREFIX + "__".join(part.upper() for part in path.split("."))


def suggest(word: str, candidates: list[str]) -> str | None:
    """The nearest valid name to ``word``, if any is close enough."""
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


def _is_open(path: str) -> bool:
    """Paths inside a strategy's ``options`` table are checked later, by its options model."""
    parts = path.split(".")
    return len(parts) >= 3 and parts[1] == _OPTIONS


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables to dotted leaf paths; values of open ``options`` tables stay whole leaves."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        depth = path.count(".")
        is_table = isinstance(value, Mapping)
        # Sections (depth 0) and options tables (depth 1) are tables; deeper values are leaves.
        if is_table and (depth == 0 or (depth == 1 and key == _OPTIONS)):
            flat.update(flatten(value, path + "."))
        else:
            flat[path] = value
    return flat


def _check_path(path: str, where: str, known: dict[str, Any]) -> ConfigIssue | None:
    if path in known or _is_open(path):
        return None
    nearest = suggest(path, list(known))
    hint = f"; did you mean {nearest!r}?" if nearest else ""
    message = f"unknown key {path!r}{hint} (valid keys: `kvcr-policy show`)"
    return ConfigIssue(path, where, message)


def profile_source(path: Path) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values of one TOML profile, each with ``profile <path> [<table>]`` as origin."""
    where = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        issue = ConfigIssue("<profile>", where, f"cannot read the profile: {err.strerror}")
        return {}, [issue]
    except tomllib.TOMLDecodeError as err:
        issue = ConfigIssue("<profile>", where, f"not valid TOML: {err}")
        return {}, [issue]
    known = known_leaves()
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    for leaf, value in flatten(data).items():
        table = leaf.rsplit(".", 1)[0] if "." in leaf else "<top level>"
        origin = profile_origin(where, table)
        problem = _check_path(leaf, origin, known)
        if problem is not None:
            issues.append(problem)
            continue
        leaves[leaf] = (value, origin)
    return leaves, issues


def _parse_env_value(raw: str, annotation: Any) -> Any:
    """Env values are strings: decode lists, None and JSON; pydantic converts the rest."""
    text = raw.strip()
    args = get_args(annotation)
    nullable = type(None) in args
    if nullable and text.lower() in {"", "none", "null"}:
        return None
    kinds = {get_origin(arg) or arg for arg in args} | {get_origin(annotation) or annotation}
    if kinds & {list, tuple}:
        if text.startswith("["):
            return json.loads(text)
        return [part.strip() for part in text.split(",") if part.strip()]
    if annotation is Any or annotation is None:
        try:
            return json.loads(text)
        except ValueError:
            return raw
    return raw


def env_source(environ: Mapping[str, str]) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values from ``KVCR_POLICY_*`` variables; an unknown variable is a problem.

    pydantic-settings ignores unknown prefixed variables, which hides typos such as
    ``KVCR_POLICY_BATCHING__READ_BATCH_PAGE``; here they are reported with the nearest name.
    """
    known = known_leaves()
    env_names = {env_name(path): path for path in known}
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        rest = upper[len(ENV_PREFIX) :]
        if rest in RESERVED_ENV:
            continue
        origin = env_origin(name)
        if rest in ALIASED_ENV:
            path = ALIASED_ENV[rest]
        else:
            path = ".".join(part.lower() for part in rest.split("__"))
        if path not in known and not _is_open(path):
            nearest = suggest(upper, list(env_names) + [ENV_PREFIX + r for r in RESERVED_ENV])
            hint = ""
            if nearest:
                target = env_names.get(nearest, "a reserved variable")
                hint = f"; did you mean {nearest} ({target})?"
            message = f"unknown variable {name}{hint} (unset it, or fix its name)"
            issues.append(ConfigIssue(path, origin, message))
            continue
        try:
            value = _parse_env_value(environ[name], known.get(path, Any))
        except ValueError as err:
            issues.append(ConfigIssue(path, origin, f"cannot parse {environ[name]!r}: {err}"))
            continue
        leaves[path] = (value, origin)
    return leaves, issues


def override_source(overrides: Mapping[str, Any]) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values given by the caller, nested or as dotted paths; strings parse as in env."""
    known = known_leaves()
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        nested.update({key: value} if "." in key else flatten({key: value}))
    for path, value in nested.items():
        issue = _check_path(path, OVERRIDE, known)
        if issue is not None:
            issues.append(issue)
            continue
        if isinstance(value, str):
            try:
                value = _parse_env_value(value, known.get(path, Any))
            except ValueError as err:
                issues.append(ConfigIssue(path, OVERRIDE, f"cannot parse {value!r}: {err}"))
                continue
        leaves[path] = (value, OVERRIDE)
    return leaves, issues
