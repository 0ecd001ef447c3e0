"""What every configuration source shares: the settings model, leaf paths, names, echoes."""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import BaseModel
from pydantic_settings import (
    BaseSettings,
    SettingsConfigDict,
)

from ...errors import ConfigIssue
from ...values import shorten
from ..schema import ENV_PREFIX, PolicyConfig

#: Leaf path -> (raw value, origin).
Leaves = dict[str, tuple[Any, str]]

#: KVCR_POLICY_* variables that are not config fields, with what they do.
RESERVED_ENV: dict[str, str] = {
    "PROFILE": "selects the profile: a bundled name or a path",
    "TRACE_HOOKS": "1 prints every plugin hook call",
    "PROC_ROOT": "reads /proc from another root (tests)",
    "SYS_ROOT": "reads /sys from another root (tests)",
    "SECRETS_DIR": "a directory of secret files (kvcr_policy_security__secret)",
}

#: Reserved variables a .env file may set; the others are read from the process environment.
DOTENV_RESERVED = ("PROFILE", "TRACE_HOOKS")

#: Variables that feed one config field under a name of their own (issue: plugins allow/block).
ALIASED_ENV: dict[str, str] = {
    "PLUGINS": "plugins.allow",
    "DISABLE_PLUGINS": "plugins.block",
}

#: Leaves whose values are secrets: never echoed, never read from a profile or an override.
SECRET_LEAVES = frozenset({"security.secret"})

_OPTIONS = "options"
#: A profile's table about the file itself (its base profile): no config value (profiles).
PROFILE_TABLE = "profile"
_NONE_WORDS = frozenset({"", "none", "null"})


class PolicySettings(BaseSettings, PolicyConfig):
    """PolicyConfig's sections with the rules by which pydantic-settings' sources read them.

    Never instantiated: loading calls the sources one by one, so each value keeps its origin.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", case_sensitive=False, env_file=".env"
    )


#: The .env file read by default, relative to the working directory.
DOTENV_FILE = str(PolicySettings.model_config["env_file"])


def echo(path: str, value: Any) -> str:
    """``value`` as an error message shows it: cut to a sane length; a secret stays hidden."""
    return "<hidden>" if path in SECRET_LEAVES else shorten(value)


def _refuse_secret(path: str, where: str, source: str) -> ConfigIssue | None:
    """A secret met in a profile or an override (a command line, a committed file): refused."""
    if path not in SECRET_LEAVES:
        return None
    message = (
        f"a secret is never read from {source} (command lines and profiles are seen by others); "
        f"set {env_name(path)} in the environment or a .env file, put it in a file named "
        f"{env_name(path).lower()} in {ENV_PREFIX}SECRETS_DIR, or name a file with "
        "security.secret_file"
    )
    return ConfigIssue(path, where, message)


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


#: Unknown keys one source names one by one, each with the nearest valid name: difflib costs
#: about 2 ms a key against the schema's names and every issue is printed (8,000 unknown keys
#: took 15.6 s and 28 MB of stderr); past these, one issue counts the rest.
MAX_NAMED = 32


class UnknownKeys:
    """Counts one source's unknown keys: :meth:`take` says whether the next one still gets an
    issue of its own, :meth:`rest` is the one issue that counts those that did not."""

    def __init__(self) -> None:
        self.count = 0
        self._where = ""

    def take(self, where: str) -> bool:
        """Count one more unknown key, met at ``where``; True while it is named by itself."""
        self.count += 1
        self._where = self._where or where
        return self.count <= MAX_NAMED

    def rest(self) -> list[ConfigIssue]:
        """The issue counting the unknown keys past the first :data:`MAX_NAMED`, if any."""
        extra = self.count - MAX_NAMED
        if extra <= 0:
            return []
        message = f"and {extra} more unknown keys (only the first {MAX_NAMED} are named)"
        return [ConfigIssue("<unknown keys>", self._where, message)]


def _check_path(
    path: str, where: str, known: dict[str, Any], unknown: UnknownKeys
) -> ConfigIssue | bool:
    """True for a known path; else the issue naming it, or False past :data:`MAX_NAMED`."""
    if path in known or _is_open(path):
        return True
    if not unknown.take(where):
        return False
    nearest = suggest(path, list(known))
    hint = f"; did you mean {nearest!r}?" if nearest else ""
    message = f"unknown key {shorten(path)}{hint} (valid keys: `kvcr-policy show`)"
    return ConfigIssue(path, where, message)


def _leaf_issue(
    path: str, where: str, known: dict[str, Any], unknown: UnknownKeys, source: str
) -> ConfigIssue | Literal[False] | None:
    """None for a known, non-secret path a profile or an override (``source``) may set; else
    the issue (an unknown key, a secret), or False for an unknown key past :data:`MAX_NAMED`."""
    checked = _check_path(path, where, known, unknown)
    if checked is True:
        return _refuse_secret(path, where, source)
    return checked or False
