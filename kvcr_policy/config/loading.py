"""load_config: sources in precedence order, deep merge, origins, one validation.

Precedence, highest first, is :data:`PRECEDENCE`: explicit overrides > ``KVCR_POLICY_*`` env >
a ``.env`` file > a secrets directory (``KVCR_POLICY_SECRETS_DIR``: the secret only) > the
selected profile > schema defaults. ``KVCR_POLICY_PROFILE`` (from the
environment, else from ``.env``; the ``profile`` argument wins over both) selects a profile by
bundled name or by path (:mod:`.selection`). The sources themselves are in
:mod:`kvcr_policy.config.sources`; the names of strategies and their options are checked once
the plugins are known (:mod:`.registered`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ..errors import ConfigError, ConfigIssue, UsageError
from ..values import as_written, shorten
from .issues import issues_from
from .profiles import base_chain
from .provenance import DEFAULT, origin_for
from .registered import effective_eviction, validate_strategies
from .schema import ENV_PREFIX, VALIDATING_ORIGINS, PolicyConfig
from .selection import choose_profile, dotenv_file, resolve_base, resolve_profile
from .sources import (
    Leaves,
    dotenv_source,
    env_source,
    flatten,
    known_leaves,
    override_source,
    profile_source,
    read_dotenv,
    secrets_source,
)

if TYPE_CHECKING:
    from ..plugins import PluginManager
    from ..registry import Registry

__all__ = ["PRECEDENCE", "LoadedConfig", "load_config"]

#: Where values come from, highest precedence first; the README lists the same order.
PRECEDENCE: tuple[str, ...] = ("override", "env", "dotenv", "secrets", "profile", DEFAULT)

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
    #: Each byte size (``*_bytes``) that was given as text, as it was written (``64GB``).
    written: Mapping[str, str] = field(default_factory=dict, compare=False)

    def size(self, path: str) -> str:
        """The size at ``path`` as written, its binary size beside it (``64GB (59.6 GiB)``)."""
        value = flatten(self.config.model_dump(mode="json")).get(path)
        return as_written(self.written.get(path), int(value or 0))

    def origin(self, path: str) -> str:
        """Where the value at ``path`` came from."""
        return origin_for(self.origins, path)

    def changed(self) -> dict[str, tuple[Any, str]]:
        """Every leaf whose value did not come from the schema default, with its origin."""
        flat = flatten(self.config.model_dump(mode="json"))
        return {p: (flat.get(p), o) for p, o in sorted(self.origins.items()) if o != DEFAULT}


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


def _merge(*sources: Leaves) -> tuple[dict[str, Any], dict[str, str]]:
    values: dict[str, Any] = {}
    origins = {p: DEFAULT for p in known_leaves() if not p.endswith(".options")}
    for source in sources:  # lowest precedence first: later ones win
        for path, (value, origin) in source.items():
            values[path] = value
            origins[path] = origin
    return values, origins


Reader = Callable[[], tuple[Leaves, list[ConfigIssue]]]


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
    dotenv_path = dotenv_file(dotenv)
    dotenv_vars: dict[str, str | None] = {}
    if dotenv_path is not None:
        dotenv_vars, found = read_dotenv(dotenv_path)
        issues += found

    chosen, where = choose_profile(profile, env, dotenv_vars, dotenv_path)
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
        issues += issues_from(err, origins, PolicyConfig)
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
    config = effective_eviction(config, origins)
    config, option_origins, found = validate_strategies(config, origins, registry)
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
        written={p: v for p, v in values.items() if p.endswith("_bytes") and isinstance(v, str)},
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
