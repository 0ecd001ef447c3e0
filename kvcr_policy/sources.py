"""Configuration sources: each turns one input into flat leaf values with their origins.

The inputs are read by pydantic-settings' own sources, configured once by
:class:`PolicySettings`: ``TomlConfigSettingsSource`` reads a profile, ``EnvSettingsSource``
reads ``KVCR_POLICY_*`` variables (prefix, ``__`` nesting, JSON for complex fields) and
``DotEnvSettingsSource`` reads a ``.env`` file. A source here returns ``{leaf path: (raw value,
origin)}`` plus the problems it found; loading merges the sources in precedence order and
validates once. Keeping sources separate (in pydantic-settings each source is a callable
returning a dict) is what lets every value remember who set it.

What this module adds to pydantic-settings: an unknown file key or ``KVCR_POLICY_*`` variable is
an error naming the nearest valid one (pydantic-settings ignores unknown prefixed variables); the
aliased and reserved variables; comma-separated lists and ``none`` for optional values; a
problem reported per variable rather than per section; and trust: a ``.env`` file or a secrets
directory is read only when it meets :mod:`.private_files`' rules (the secrets directory is read
here, not by pydantic-settings' ``SecretsSettingsSource``: see :func:`secrets_source`).
"""

from __future__ import annotations

import difflib
import errno
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, get_args, get_origin

from dotenv.parser import parse_stream
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)
from pydantic_settings.sources.utils import parse_env_vars

from .errors import ConfigIssue
from .private_files import FileRefused, dotenv_problem, folder_problem, read_private
from .provenance import OVERRIDE, dotenv_origin, env_origin, profile_origin, secrets_origin
from .schema import ENV_PREFIX, PolicyConfig
from .values import shorten

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "ALIASED_ENV",
    "DOTENV_FILE",
    "PROFILE_TABLE",
    "RESERVED_ENV",
    "SECRET_LEAVES",
    "Leaves",
    "PolicySettings",
    "dotenv_source",
    "echo",
    "env_name",
    "env_source",
    "flatten",
    "known_leaves",
    "override_source",
    "profile_source",
    "read_dotenv",
    "secrets_source",
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
#: A profile's table about the file itself (its base profile): no config value (profile_meta).
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


def _check_path(path: str, where: str, known: dict[str, Any]) -> ConfigIssue | None:
    if path in known or _is_open(path):
        return None
    nearest = suggest(path, list(known))
    hint = f"; did you mean {nearest!r}?" if nearest else ""
    message = f"unknown key {shorten(path)}{hint} (valid keys: `kvcr-policy show`)"
    return ConfigIssue(path, where, message)


def profile_source(path: Path) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values of one TOML profile, each with ``profile <path> [<table>]`` as origin."""
    where = str(path)
    if not path.is_file():  # pydantic-settings skips a missing file; a chosen profile must exist
        reason = os.strerror(errno.EISDIR if path.is_dir() else errno.ENOENT)
        return {}, [ConfigIssue("<profile>", where, f"cannot read the profile: {reason}")]
    try:
        data = TomlConfigSettingsSource(PolicySettings, toml_file=path)()
    except OSError as err:
        issue = ConfigIssue("<profile>", where, f"cannot read the profile: {err.strerror}")
        return {}, [issue]
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        issue = ConfigIssue("<profile>", where, f"not valid TOML: {shorten(str(err))}")
        return {}, [issue]
    except RecursionError:  # tomllib recurses once per nested array or inline table
        message = "not a profile: arrays or tables nested too deeply to read"
        return {}, [ConfigIssue("<profile>", where, message)]
    known = known_leaves()
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    data = {key: value for key, value in data.items() if key != PROFILE_TABLE}
    for leaf, value in flatten(data).items():
        table = leaf.rsplit(".", 1)[0] if "." in leaf else "<top level>"
        origin = profile_origin(where, table)
        problem = _check_path(leaf, origin, known) or _refuse_secret(leaf, origin, "a profile")
        if problem is not None:
            issues.append(problem)
            continue
        leaves[leaf] = (value, origin)
    return leaves, issues


def _decode(raw: str, annotation: Any) -> Any:
    """A string value as env spells it: lists comma-separated or JSON, ``none`` unsets.

    These are the project's spellings on top of pydantic-settings (which only knows JSON); an
    empty variable is an empty list for a list field (``KVCR_POLICY_PLUGINS=`` allows no
    third-party plugin); any other empty value is refused: ``none`` unsets an optional field,
    and an empty one must not (``security.tenants_dir=`` once unset the tenants of an operator
    who meant to name a folder, and the server started with one tenant, saying nothing).
    """
    text = raw.strip()
    args = get_args(annotation)
    nullable = type(None) in args
    kinds = {get_origin(arg) or arg for arg in args} | {get_origin(annotation) or annotation}
    if kinds & {list, tuple}:
        if text.startswith("["):
            return json.loads(text)
        if nullable and text and text.lower() in _NONE_WORDS:
            return None
        return [part.strip() for part in text.split(",") if part.strip()]
    if not text and annotation not in (str, Any):  # options tables: their own models judge
        hint = "write none to unset it" if nullable else "give a value"
        raise ValueError(f"an empty value; {hint}")
    if nullable and text.lower() in _NONE_WORDS:
        return None
    if kinds & {dict}:
        return json.loads(text)
    if annotation is Any or annotation is None:
        try:
            return json.loads(text)
        except ValueError:
            return raw
    return raw


class _VariableSource(EnvSettingsSource):
    """pydantic-settings' env source over given variables, with the project's list spelling."""

    def __init__(self, variables: Mapping[str, str]) -> None:
        self._variables = variables
        self.problem: ValueError | None = None
        super().__init__(PolicySettings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # The seam DotEnvSettingsSource overrides too: read a mapping instead of os.environ.
        return parse_env_vars(
            self._variables, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )

    def decode_complex_value(self, field_name: str, field: FieldInfo | None, value: Any) -> Any:
        annotation = field.annotation if field is not None else Any
        try:
            return _decode(value, annotation)
        except ValueError as err:
            self.problem = err  # a union field swallows decode errors; they are still errors
            raise


def _dig(nested: Mapping[str, Any], path: str) -> Any:
    node: Any = nested
    for part in path.split("."):
        node = node[part]
    return node


def _read_variable(path: str, raw: str, known: dict[str, Any]) -> Leaves | ValueError:
    """The leaves one variable sets (raw values, no origin yet), or why it cannot be parsed.

    Each variable goes through the env source alone: every leaf it yields is known to be that
    variable's, and a bad value is reported for the variable instead of aborting its section.
    """
    source = _VariableSource({ENV_PREFIX + "__".join(path.split(".")): raw})
    try:
        value = _dig(source(), path)
    except SettingsError as err:
        cause = source.problem or err.__cause__
        return cause if isinstance(cause, ValueError) else ValueError(str(err))
    if path.endswith("." + _OPTIONS) and isinstance(value, Mapping):  # a JSON options table
        return {f"{path}.{key}": item for key, item in value.items()}
    if isinstance(value, str):  # fields pydantic-settings leaves as text: scalars, open options
        try:
            value = _decode(value, known.get(path, Any))
        except ValueError as err:
            return err
    return {path: value}


def _variables_source(
    variables: Mapping[str, str | None],
    origin_of: Callable[[str], str],
    fix: str,
    reserved_ok: tuple[str, ...] = tuple(RESERVED_ENV),
) -> tuple[Leaves, list[ConfigIssue]]:
    known = known_leaves()
    env_names = {env_name(path): path for path in known}
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    for name in sorted(variables):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        rest = upper[len(ENV_PREFIX) :]
        origin = origin_of(name)
        raw = variables[name]
        if raw is None:  # a .env line with a name and no '='
            issues.append(ConfigIssue(name, origin, f"no value; write {name}=VALUE"))
            continue
        if rest in RESERVED_ENV:
            if rest not in reserved_ok:
                message = (
                    f"{name} has no effect in a .env file: it is read from the process "
                    "environment only; export it instead"
                )
                issues.append(ConfigIssue(name, origin, message))
            continue
        path = ALIASED_ENV.get(rest) or ".".join(part.lower() for part in rest.split("__"))
        if path not in known and not _is_open(path):
            nearest = suggest(upper, list(env_names) + [ENV_PREFIX + r for r in RESERVED_ENV])
            hint = ""
            if nearest:
                target = env_names.get(nearest, "a reserved variable")
                hint = f"; did you mean {nearest} ({target})?"
            message = f"unknown variable {name}{hint} ({fix})"
            issues.append(ConfigIssue(path, origin, message))
            continue
        found = _read_variable(path, raw, known)
        if isinstance(found, ValueError):
            issues.append(ConfigIssue(path, origin, f"cannot parse {echo(path, raw)}: {found}"))
            continue
        leaves.update({leaf: (value, origin) for leaf, value in found.items()})
    return leaves, issues


def env_source(environ: Mapping[str, str]) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values from ``KVCR_POLICY_*`` variables; an unknown variable is a problem.

    pydantic-settings ignores unknown prefixed variables, which hides typos such as
    ``KVCR_POLICY_BATCHING__READ_BATCH_PAGE``; here they are reported with the nearest name.
    """
    return _variables_source(environ, env_origin, "unset it, or fix its name")


def read_dotenv(path: Path) -> tuple[dict[str, str | None], list[ConfigIssue]]:
    """The variables of a ``.env`` file as pydantic-settings reads them, names as written.

    python-dotenv only logs a line it cannot parse and skips it; here that is a problem naming
    the line, so a typo cannot silently drop a setting. A file the user does not own, that
    others may write, or that sets ``security.*`` values and others may read, configures
    nothing (:func:`~kvcr_policy.private_files.dotenv_problem`): it is refused whole.
    """
    where = f"dotenv {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) else f"not UTF-8 text ({err.reason})"
        return {}, [ConfigIssue("<dotenv>", where, f"cannot read the .env file: {reason}")]
    bindings = list(parse_stream(io.StringIO(text)))
    issues = [
        ConfigIssue(
            "<dotenv>",
            where,
            f"line {binding.original.line}: cannot parse "
            f"{shorten(binding.original.string.strip())}; "
            "expected NAME=VALUE (quote a value that holds spaces, quotes or '#')",
        )
        for binding in bindings
        if binding.error
    ]
    if issues:
        # The load fails; the well-formed lines are still checked, so that it reports every
        # problem at once (python-dotenv would log the bad lines a second time).
        return {b.key: b.value for b in bindings if b.key is not None}, issues
    reader = DotEnvSettingsSource(PolicySettings, env_file=path, case_sensitive=True)
    variables = dict(reader.env_vars)
    security = ENV_PREFIX + "SECURITY__"
    problem = dotenv_problem(path, any(name.upper().startswith(security) for name in variables))
    if problem is not None:
        return {}, [ConfigIssue("<dotenv>", where, problem)]
    return variables, []


def dotenv_source(
    variables: Mapping[str, str | None], path: Path
) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values from the ``KVCR_POLICY_*`` variables of a ``.env`` file at ``path``."""
    where = str(path)
    return _variables_source(
        variables,
        lambda name: dotenv_origin(where, name),
        f"remove it from {where}, or fix its name",
        reserved_ok=DOTENV_RESERVED,
    )


def override_source(overrides: Mapping[str, Any]) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values given by the caller, nested or as dotted paths; strings parse as in env."""
    known = known_leaves()
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    nested: dict[str, Any] = {}
    for key, value in overrides.items():
        nested.update({key: value} if "." in key else flatten({key: value}))
    for path, value in nested.items():
        issue = _check_path(path, OVERRIDE, known) or _refuse_secret(path, OVERRIDE, "overrides")
        if issue is not None:
            issues.append(issue)
            continue
        if isinstance(value, str):
            try:
                value = _decode(value, known.get(path, Any))
            except ValueError as err:
                issues.append(
                    ConfigIssue(path, OVERRIDE, f"cannot parse {echo(path, value)}: {err}")
                )
                continue
        leaves[path] = (value, OVERRIDE)
    return leaves, issues


def secrets_source(directory: Path) -> tuple[Leaves, list[ConfigIssue]]:
    """Secret leaves from the files of a secrets directory, as Docker and Kubernetes mount
    secrets: one file per field, named ``kvcr_policy_security__<field>`` (any case).

    pydantic-settings' ``SecretsSettingsSource`` reads such a folder, but skips a FIFO with a
    bare warning (the process then goes on with the next source), follows a link anywhere and
    takes any owner and mode; here each file is held to the secret-file rules
    (:func:`~kvcr_policy.private_files.read_private`), except that root may let others read it
    (Kubernetes mounts secrets 0644) and a link is followed within the folder (Kubernetes
    mounts each secret as a link into its ``..data`` folder).
    """
    where = f"env {ENV_PREFIX}SECRETS_DIR"
    shown = shorten(str(directory))
    if not directory.is_dir():
        reason = "is not a directory" if directory.exists() else "does not exist"
        return {}, [ConfigIssue("<secrets>", where, f"the secrets directory {shown} {reason}")]
    try:
        entries = os.listdir(directory)
        inside = directory.resolve()
    except OSError as err:
        message = f"cannot read the secrets directory {shown}: {err.strerror}"
        return {}, [ConfigIssue("<secrets>", where, message)]
    problem = folder_problem(directory)
    if problem is not None:
        return {}, [ConfigIssue("<secrets>", where, f"the secrets directory: {problem}")]
    leaves: Leaves = {}
    issues: list[ConfigIssue] = []
    for path in sorted(SECRET_LEAVES):
        name = env_name(path).lower()
        found = sorted(entry for entry in entries if entry.lower() == name)
        if not found:
            continue
        file = directory / found[0]
        origin = secrets_origin(str(file))
        try:
            if len(found) > 1:
                raise FileRefused(f"{', '.join(found)} in {shown} all name {path}; keep one")
            real = file.resolve()
            if not real.is_relative_to(inside):
                message = f"{shorten(str(file))} is a link out of the secrets directory"
                raise FileRefused(message)
            text = read_private(real, root_may_share=True).decode("utf-8").strip()
        except FileRefused as err:
            issues.append(ConfigIssue(path, origin, str(err)))
            continue
        except (OSError, UnicodeDecodeError) as err:
            reason = str(err.strerror) if isinstance(err, OSError) else "not UTF-8 text"
            issues.append(ConfigIssue(path, origin, f"cannot read {shorten(str(file))}: {reason}"))
            continue
        leaves[path] = (text, origin)
    return leaves, issues
