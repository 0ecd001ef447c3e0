"""load_config: sources in precedence order, deep merge, origins, one validation.

Precedence, highest first, is :data:`PRECEDENCE`: explicit overrides > ``KVCR_POLICY_*`` env >
a ``.env`` file > a secrets directory (``KVCR_POLICY_SECRETS_DIR``: the secret only) > the
selected profile > schema defaults. ``KVCR_POLICY_PROFILE`` (from the
environment, else from ``.env``; the ``profile`` argument wins over both) selects a profile by
bundled name or by path. The sources themselves are in :mod:`kvcr_policy.config.sources`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError, ConfigIssue, UsageError
from ..values import shorten
from .profiles import base_chain
from .provenance import DEFAULT, dotenv_origin, origin_for
from .schema import ENV_PREFIX, STRATEGY_SECTIONS, VALIDATING_ORIGINS, PolicyConfig
from .sources import (
    DOTENV_FILE,
    Leaves,
    UnknownKeys,
    dotenv_source,
    echo,
    env_source,
    flatten,
    known_leaves,
    override_source,
    profile_source,
    read_dotenv,
    secrets_source,
    suggest,
)
from .user_files import file_kind

if TYPE_CHECKING:
    from ..plugins import PluginManager
    from ..registry import Registry

__all__ = [
    "PRECEDENCE",
    "LoadedConfig",
    "bundled_profiles",
    "load_config",
    "profile_or",
    "resolve_base",
    "resolve_profile",
]

#: Where values come from, highest precedence first; the README lists the same order.
PRECEDENCE: tuple[str, ...] = ("override", "env", "dotenv", "secrets", "profile", DEFAULT)

PROFILE_ENV = ENV_PREFIX + "PROFILE"
SECRETS_DIR_ENV = ENV_PREFIX + "SECRETS_DIR"


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config, where each of its values came from, and the profile used."""

    config: PolicyConfig
    origins: Mapping[str, str]
    profile: str | None = None
    registry: Registry | None = field(default=None, compare=False, repr=False)
    #: The plugin manager that validated this config, reused by build_pipeline; None when the
    #: caller supplied a registry (build_pipeline then makes one from ``config``).
    plugin_manager: PluginManager | None = field(default=None, compare=False, repr=False)
    #: The profiles ``profile`` extends (``[profile] base``), nearest first.
    bases: tuple[str, ...] = ()

    def origin(self, path: str) -> str:
        """Where the value at ``path`` came from."""
        return origin_for(self.origins, path)

    def changed(self) -> dict[str, tuple[Any, str]]:
        """Every leaf whose value did not come from the schema default, with its origin."""
        flat = flatten(self.config.model_dump(mode="json"))
        return {p: (flat.get(p), o) for p, o in sorted(self.origins.items()) if o != DEFAULT}


def profiles_dir() -> Path:
    """The folder of bundled profiles."""
    return Path(__file__).resolve().parents[1] / "profiles"


def bundled_profiles() -> dict[str, Path]:
    """Bundled profile names and their files."""
    return {p.stem: p for p in sorted(profiles_dir().glob("*.toml"))}


def _kind(path: Path) -> str | None:
    """What ``path`` is when it exists but is no regular file (``a FIFO, not a regular file``)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    return None if stat.S_ISREG(mode) else f"{file_kind(mode)}, not a regular file"


def resolve_profile(profile: str | os.PathLike[str], where: str) -> Path:
    """A bundled name or a path -> the profile file; raise ConfigError naming the choices."""
    text = os.fspath(profile)
    bundled = bundled_profiles()
    if text in bundled:
        return bundled[text]

    def missing(nearest: str | None) -> str:
        hint = f"; did you mean {nearest!r}?" if nearest else ""
        return (
            f"no bundled profile or file named {shorten(text)}{hint} "
            f"(bundled: {', '.join(bundled) or 'none'}; or give a path to a .toml file)"
        )

    path = Path(text).expanduser()
    return _profile_file(path, text, shorten(text), ("profile", where), missing)


def resolve_base(name: str, folder: Path, where: str) -> Path:
    """A ``[profile] base``: a bundled name, else a path relative to the naming file's folder."""
    bundled = bundled_profiles()
    if name in bundled:
        return bundled[name]
    path = Path(name).expanduser()
    path = path if path.is_absolute() else folder / path

    def missing(nearest: str | None) -> str:
        hint = f" (did you mean {nearest!r}?)" if nearest else ""
        return (
            f"base {name!r} is neither a bundled profile{hint} nor a file (looked for {path}); "
            f"name one of: {', '.join(bundled)}, or a path relative to this file"
        )

    return _profile_file(path, name, f"base {name!r} ({path})", ("profile.base", where), missing)


def _profile_file(
    path: Path,
    name: str,
    shown: str,
    field: tuple[str, str],
    missing: Callable[[str | None], str],
) -> Path:
    """``path`` resolved where it is a file; else a ConfigError at ``field`` (the setting's path
    and origin): a directory, a device or a pipe (nothing a profile can be read from) named as
    ``shown``, or nothing there: ``missing`` with the bundled profile nearest ``name``."""
    if path.is_file():
        return path.resolve()
    kind = _kind(path)
    base = field[0] == "profile.base"
    if kind is not None:
        what = "a base" if base else "a profile"
        message = f"{shown} is {kind}; {what} is a bundled name or a .toml file"
    else:
        message = missing(suggest(name, list(bundled_profiles())))
    title = "cannot find a base" if base else "cannot select a profile"
    raise ConfigError([ConfigIssue(*field, message)], title=title)


def _chain_source(chain: list[Path]) -> tuple[Leaves, list[ConfigIssue]]:
    """The values of a profile over those of its bases: the nearest file wins, each value
    keeping the file it came from as its origin."""
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    for path in reversed(chain):
        found, problems = profile_source(path)
        leaves.update(found)
        issues += problems
    return leaves, issues


def _unflatten(leaves: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for path, value in leaves.items():
        parts = path.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def _unknown_key(model: type[BaseModel], loc: list[str]) -> str:
    """``unknown key``, with the nearest valid name of the table that holds it."""
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return "unknown key"
        model = annotation
    names = list(model.model_fields)
    nearest = suggest(loc[-1], names) if loc else None
    hint = f"; did you mean {nearest!r}?" if nearest else ""
    return f"unknown key{hint} (valid: {', '.join(names) or 'none'})"


def _issues_from(
    err: ValidationError, origins: Mapping[str, str], model: type[BaseModel], prefix: str = ""
) -> list[ConfigIssue]:
    issues = []
    unknown = UnknownKeys()
    for item in err.errors(include_url=False):
        loc = [str(part) for part in item["loc"]]
        path = prefix + ".".join(loc) if loc else prefix.rstrip(".") or "<config>"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            if not unknown.take(origin_for(origins, path)):
                continue
            message = _unknown_key(model, loc)
        elif item["type"] != "value_error":
            message = (
                f"expected: {message[0].lower()}{message[1:]}; got {echo(path, item['input'])}"
            )
        issues.append(ConfigIssue(path, origin_for(origins, path), message))
    return issues + unknown.rest()


def _merge(*sources: Leaves) -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    origins = {p: DEFAULT for p in known_leaves() if not p.endswith(".options")}
    for source in sources:  # lowest precedence first: later ones win
        for path, (value, origin) in source.items():
            values[path] = value
            origins[path] = origin
    return values, origins


Reader = Callable[[], tuple[Leaves, list[ConfigIssue]]]


def _dotenv_file(dotenv: str | os.PathLike[str] | bool) -> Path | None:
    """The .env file to read: ``True`` is ``./.env`` when present, a path must exist."""
    if dotenv is False:
        return None
    if dotenv is True:
        default = Path(DOTENV_FILE)
        return default.resolve() if default.is_file() else None
    return Path(os.fspath(dotenv)).expanduser().resolve()


def _choose_profile(
    profile: str | os.PathLike[str] | None,
    env: Mapping[str, str],
    dotenv_vars: Mapping[str, str | None],
    dotenv_path: Path | None,
) -> tuple[str | os.PathLike[str] | None, str]:
    """The one fallback every command shares: the argument, else the environment, else .env."""
    if profile is not None:
        return profile, "argument profile"
    if env.get(PROFILE_ENV):
        return env[PROFILE_ENV], f"env {PROFILE_ENV}"
    return dotenv_vars.get(PROFILE_ENV) or None, dotenv_origin(str(dotenv_path), PROFILE_ENV)


def profile_or(profile: str | None, default: str) -> str:
    """A command's profile: ``--profile``, else KVCR_POLICY_PROFILE (environment, then ./.env),
    else the command's own ``default``; a name from the environment is checked here so that its
    error names the variable it came from."""
    dotenv_path = _dotenv_file(True)
    dotenv_vars = read_dotenv(dotenv_path)[0] if dotenv_path is not None else {}
    chosen, where = _choose_profile(profile, os.environ, dotenv_vars, dotenv_path)
    if chosen is None:
        return default
    if profile is None:
        resolve_profile(chosen, where)
    return os.fspath(chosen)


def load_config(
    profile: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    registry: Registry | None = None,
    dotenv: str | os.PathLike[str] | bool = True,
) -> LoadedConfig:
    """Load, merge and validate the configuration; report every problem of the load at once.

    ``environ`` defaults to ``os.environ``; ``overrides`` take dotted paths or nested tables.
    ``dotenv`` is the ``.env`` file to read: ``True`` reads ``.env`` in the working directory if
    there is one, a path names another file (which must exist), ``False`` reads none. Strategy
    options are validated by the options model each strategy registered; ``registry`` defaults
    to the one of a fresh :func:`kvcr_policy.plugins.make_plugin_manager`, kept as
    ``plugin_manager`` for :func:`kvcr_policy.pipeline.build_pipeline`.
    """
    _check_arguments(profile, environ, overrides, dotenv)
    env = dict(os.environ if environ is None else environ)
    issues: list[ConfigIssue] = []
    dotenv_path = _dotenv_file(dotenv)
    dotenv_vars: dict[str, str | None] = {}
    if dotenv_path is not None:
        dotenv_vars, found = read_dotenv(dotenv_path)
        issues += found

    chosen, where = _choose_profile(profile, env, dotenv_vars, dotenv_path)
    profile_path = resolve_profile(chosen, where) if chosen is not None else None
    secrets_dir = env.get(SECRETS_DIR_ENV)
    chain: list[Path] = []
    if profile_path is not None:
        chain, found = base_chain(profile_path, resolve_base)
        issues += found

    readers: dict[str, Reader] = {
        "override": lambda: override_source(overrides or {}),
        "env": lambda: env_source(env),
        "dotenv": lambda: dotenv_source(dotenv_vars, dotenv_path) if dotenv_path else ({}, []),
        "secrets": lambda: secrets_source(Path(secrets_dir)) if secrets_dir else ({}, []),
        "profile": lambda: _chain_source(chain),
    }
    layers: list[Leaves] = []
    for kind in reversed(PRECEDENCE):  # lowest first, so that later ones win
        if kind == DEFAULT:
            continue  # schema defaults are filled in by validation; _merge marks their origin
        leaves, found = readers[kind]()
        issues += found
        layers.append(leaves)

    values, origins = _merge(*layers)
    # The origins let a cross-field rule name where each of its values came from.
    known = VALIDATING_ORIGINS.set(origins)
    try:
        config = PolicyConfig.model_validate(_unflatten(values))
    except ValidationError as err:
        issues += _issues_from(err, origins, PolicyConfig)
        raise ConfigError(issues) from None
    finally:
        VALIDATING_ORIGINS.reset(known)
    if issues:
        raise ConfigError(issues)

    plugin_manager = None
    if registry is None:
        from ..plugins import make_plugin_manager

        # Allow and block lists come from ``config`` only; the trace switch may sit in .env.
        trace_env = {**{k: v for k, v in dotenv_vars.items() if v is not None}, **env}
        plugin_manager = make_plugin_manager(config, environ=trace_env)
        registry = plugin_manager.registry
    config = _effective_eviction(config, origins)
    config, option_origins, found = _validate_strategies(config, origins, registry)
    if found:
        raise ConfigError(found)
    origins.update(option_origins)
    return LoadedConfig(
        config=config,
        origins=dict(sorted(origins.items())),
        profile=str(profile_path) if profile_path else None,
        registry=registry,
        plugin_manager=plugin_manager,
        bases=tuple(str(path) for path in chain[1:]),
    )


def _check_arguments(profile: Any, environ: Any, overrides: Any, dotenv: Any) -> None:
    """Refuse arguments of the wrong kind (UsageError) before they fail deep inside."""
    problem = None
    if profile is not None and not isinstance(profile, (str, os.PathLike)):
        problem = f"profile must be a name or a path (str), got {type(profile).__name__}"
    elif environ is not None and not isinstance(environ, Mapping):
        problem = f"environ must be a mapping of str to str, got {type(environ).__name__}"
    elif overrides is not None and not isinstance(overrides, Mapping):
        problem = (
            f"overrides must be a mapping such as {{'batching.read_batch_pages': 64}}, got "
            f"{type(overrides).__name__} {shorten(overrides)}"
        )
    elif not isinstance(dotenv, (bool, str, os.PathLike)):
        problem = f"dotenv must be True, False or a path, got {type(dotenv).__name__}"
    if problem is None and environ is not None:
        bad = next(
            ((k, v) for k, v in environ.items() if not (isinstance(k, str) and isinstance(v, str))),
            None,
        )
        if bad is not None:
            problem = (
                f"environ must map str to str (as os.environ does); {shorten(bad[0])} maps to "
                f"{type(bad[1]).__name__} {shorten(bad[1])}"
            )
    if problem is None and overrides is not None:
        key = next((k for k in overrides if not isinstance(k, str)), None)
        if key is not None:
            problem = f"overrides keys must be dotted paths (str), got {shorten(key)}"
    if problem is not None:
        raise UsageError(f"load_config(): {problem}")


def _effective_eviction(config: PolicyConfig, origins: dict[str, str]) -> PolicyConfig:
    """``eviction.strategy`` as it takes effect: when unset, ``placement.eviction`` (the older
    spelling), with that value's origin, so ``show`` prints where the choice was made."""
    if config.eviction.strategy is not None:
        return config
    origins["eviction.strategy"] = origins.get("placement.eviction", DEFAULT)
    section = config.eviction.model_copy(update={"strategy": config.placement.eviction})
    return config.model_copy(update={"eviction": section})


def _validate_strategies(
    config: PolicyConfig, origins: dict[str, str], registry: Registry
) -> tuple[PolicyConfig, dict[str, str], list[ConfigIssue]]:
    """Check each strategy name and validate its options with that strategy's own model."""
    issues: list[ConfigIssue] = []
    updates: dict[str, Any] = {}
    option_origins: dict[str, str] = {}
    named = [(section, kind, "strategy") for section, kind in STRATEGY_SECTIONS.items()]
    named.append(("transport", "transport", "name"))
    named.append(("backend", "backend", "name"))
    for section_name, kind, key in named:
        section = getattr(config, section_name)
        name = getattr(section, key)
        path = f"{section_name}.{key}"
        if kind == "backend":
            name = registry.backend_for(name, config.transport.name)
        spec = registry.find(kind, name)
        if spec is None:
            names = registry.names(kind)
            nearest = suggest(name, names)
            hint = f"; did you mean {nearest!r}?" if nearest else ""
            # The name may belong to a plugin that was blocked or failed: say which were skipped.
            skipped = ", ".join(f"{b.name} ({b.reason})" for b in registry.broken)
            noun = kind if kind in {"transport", "backend"} else f"{kind} strategy"
            message = (
                f"unknown {noun} "
                f"{shorten(name)}{hint} (registered: {', '.join(names) or 'none'}; "
                + (f"skipped plugins: {skipped}; " if skipped else "")
                + "`kvcr-policy plugins` lists them and who provides them)"
            )
            issues.append(ConfigIssue(path, origin_for(origins, path), message))
            continue
        model: type[BaseModel] = spec.options
        prefix = f"{section_name}.options."
        try:
            options = model.model_validate(section.options)
        except ValidationError as err:
            # Each option problem names whose options they are (they differ per strategy).
            owner = f" [options of {section_name} {name!r}]"
            found = _issues_from(err, origins, model, prefix)
            issues += [replace(issue, message=issue.message + owner) for issue in found]
            continue
        dumped = options.model_dump(mode="json")
        updates[section_name] = section.model_copy(update={"options": dumped})
        for leaf in dumped:
            option_origins[prefix + leaf] = origins.get(prefix + leaf, DEFAULT)
    for path in [p for p in origins if ".options." in p]:
        origins.pop(path)
    if issues:
        return config, option_origins, issues
    return config.model_copy(update=updates), option_origins, issues
