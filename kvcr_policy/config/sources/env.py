"""``KVCR_POLICY_*`` variables: leaves from the process environment (prefix, ``__`` nesting)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, get_args, get_origin

from pydantic.fields import FieldInfo
from pydantic_settings import (
    EnvSettingsSource,
    SettingsError,
)
from pydantic_settings.sources.utils import parse_env_vars

from ...errors import ConfigIssue
from ..provenance import env_origin
from ..schema import ENV_PREFIX
from .common import (
    _NONE_WORDS,
    _OPTIONS,
    ALIASED_ENV,
    RESERVED_ENV,
    Leaves,
    PolicySettings,
    UnknownKeys,
    _is_open,
    echo,
    env_name,
    known_leaves,
    suggest,
)


def _decode(raw: str, annotation: Any) -> Any:
    """:func:`_decode_text`, with JSON nested too deeply for ``json`` (which recurses once per
    level) a ValueError like any other bad value, not a RecursionError."""
    try:
        return _decode_text(raw, annotation)
    except RecursionError:
        raise ValueError("JSON nested too deeply to read") from None


def _decode_text(raw: str, annotation: Any) -> Any:
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
    except RecursionError:  # pydantic-settings' json.loads of a complex field
        return ValueError("JSON nested too deeply to read")
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
    unknown = UnknownKeys()
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
            if not unknown.take(origin):
                continue
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
    return leaves, issues + unknown.rest()


def env_source(environ: Mapping[str, str]) -> tuple[Leaves, list[ConfigIssue]]:
    """Leaf values from ``KVCR_POLICY_*`` variables; an unknown variable is a problem.

    pydantic-settings ignores unknown prefixed variables, which hides typos such as
    ``KVCR_POLICY_BATCHING__READ_BATCH_PAGE``; here they are reported with the nearest name.
    """
    return _variables_source(environ, env_origin, "unset it, or fix its name")
