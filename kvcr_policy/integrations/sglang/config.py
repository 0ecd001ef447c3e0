"""The ``extra_config`` of SGLang's dynamic HiCache backend: which keys are ours, which SGLang's.

SGLang passes ``--hicache-storage-backend-extra-config`` (a JSON object) to the backend as
``storage_config.extra_config``. kvcr_policy reads two keys of its own (:data:`OWN_KEYS`) and
tolerates the keys SGLang 0.5.23 itself reads from the same object (:data:`SGLANG_KEYS`,
:data:`SGLANG_PREFIXES`); anything else is a typo or a key of another backend, and is refused
with the list of known keys, so that a misspelt ``"profil"`` cannot silently run the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from ...config.sources import UnknownKeys, known_leaves, suggest
from ...errors import ConfigError, ConfigIssue
from .flag import FILE_FORMATS, read_object

__all__ = [
    "EXTRA_CONFIG_ORIGIN",
    "LOADER_KEYS",
    "OWN_KEYS",
    "SGLANG_KEYS",
    "SGLANG_PREFIXES",
    "BackendOptions",
    "extra_config_for",
    "override_origins",
    "parse_extra_config",
]

EXTRA_CONFIG_ORIGIN: Final = "SGLang --hicache-storage-backend-extra-config"
KWARGS_ORIGIN: Final = "KVCRPolicyStorage(storage_config, kwargs)"

#: Values and levels an ``overrides`` object may hold (:func:`_size_problem`): far above a
#: configuration's (about 60 values, 3 levels: ``backend.options.master``).
MAX_OVERRIDE_VALUES: Final = 4096
MAX_OVERRIDE_DEPTH: Final = 16

OWN_KEYS: Final[Mapping[str, str]] = {
    "profile": "a bundled profile name (default, throughput) or the path of a TOML profile",
    "overrides": (
        "config overrides, dotted paths or nested tables: a JSON object, JSON text, or @FILE "
        "(.json, .toml, .yaml)"
    ),
}

# Keys SGLang 0.5.23 reads from the same JSON object, found in its source:
#   backend_name, module_path, class_name  mem_cache/storage/backend_factory.py,
#                                          StorageBackendFactory._create_dynamic_backend
#   interface_v1                           managers/cache_controller.py, attach_storage_backend
#   tp_lcm_size                            managers/cache_controller.py, _generate_storage_config
#   hicache_storage_pass_prefix_keys       mem_cache/hybrid_cache/hybrid_cache_controller.py,
#   prefetch_threshold, prefetch_timeout_*   parse_storage_backend_extra_config (popped there,
#                                          but not on every path: decode_kvcache_offload_manager)
#   allocator                              mem_cache/pool_host/common.py, get_allocator_type
SGLANG_KEYS: Final = frozenset(
    {
        "backend_name",
        "module_path",
        "class_name",
        "interface_v1",
        "tp_lcm_size",
        "hicache_storage_pass_prefix_keys",
        "allocator",
    }
)
SGLANG_PREFIXES: Final = ("prefetch_",)

#: The keys SGLang's dynamic loader needs to build this backend, with their values.
LOADER_KEYS: Final[Mapping[str, Any]] = {
    "backend_name": "kvcr_policy",
    "module_path": "kvcr_policy.integrations.sglang",
    "class_name": "KVCRPolicyStorage",
    "interface_v1": 1,
}


def extra_config_for(
    profile: str | None = None, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``--hicache-storage-backend-extra-config`` object selecting this backend with
    ``profile`` (a bundled name or a path) and ``overrides``; checked as the backend will."""
    config: dict[str, Any] = dict(LOADER_KEYS)
    if profile is not None:
        config["profile"] = profile
    if overrides:
        config["overrides"] = dict(overrides)
    parse_extra_config(config)
    return config


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """What kvcr_policy takes from ``extra_config`` (and the constructor's ``kwargs``)."""

    profile: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    interface_v1: bool = False
    # Where the profile was named ("" when it was not): shown in the start-up log.
    profile_origin: str = ""
    # Where the overrides were given (an origin as in ``profile_origin``).
    overrides_origin: str = ""


def _is_sglang_key(key: str) -> bool:
    return key in SGLANG_KEYS or key.startswith(SGLANG_PREFIXES)


def _known() -> str:
    return (
        f"kvcr_policy reads {', '.join(OWN_KEYS)}; SGLang's own keys are tolerated: "
        f"{', '.join(sorted(SGLANG_KEYS))}, {', '.join(p + '*' for p in SGLANG_PREFIXES)}"
    )


def _check(key: str, value: Any, origin: str, issues: list[ConfigIssue]) -> tuple[Any, str]:
    """``value`` as kvcr_policy uses it and the origin of what it holds (``@FILE`` overrides:
    the file); problems go to ``issues``."""
    path = f"extra_config.{key}"
    if key == "profile":
        if not (isinstance(value, str) and value.strip()):
            message = f"expected {OWN_KEYS['profile']}; got {value!r}"
            issues.append(ConfigIssue(path, origin, message))
        return value, f"{origin} ['profile']"
    where = f"{origin} ['overrides']"
    try:
        overrides = read_object(value, path, origin)
    except ConfigError as err:
        issues.extend(err.issues)
        return {}, where
    if isinstance(value, str) and value.strip().startswith("@"):
        where = f"{where} {value.strip()}"
    problem = _size_problem(overrides)
    if problem is not None:
        message = (
            f"{problem}; a configuration holds about {len(known_leaves())} values nested 3 "
            "deep (`kvcr-policy show` lists them): is this the overrides file you meant?"
        )
        issues.append(ConfigIssue(path, where, message))
        return {}, where
    return overrides, where


def _size_problem(value: Any) -> str | None:
    """Why ``overrides`` are too large to read, or None. Counted node by node, each shared
    node (a YAML alias) every time it is met, and never past the bounds: a 2 KiB YAML file of
    aliases holds 2**30 leaves, which the provenance walk once visited one by one."""
    stack = [(value, 0)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        if isinstance(node, Mapping):
            children: Any = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if depth >= MAX_OVERRIDE_DEPTH:
            return f"values nested deeper than {MAX_OVERRIDE_DEPTH} levels"
        for child in children:
            nodes += 1
            if nodes > MAX_OVERRIDE_VALUES:
                return f"more than {MAX_OVERRIDE_VALUES} values"
            stack.append((child, depth + 1))
    return None


def parse_extra_config(
    extra_config: Mapping[str, Any] | None,
    kwargs: Mapping[str, Any] | None = None,
    *,
    origin: str = EXTRA_CONFIG_ORIGIN,
) -> BackendOptions:
    """Validate ``extra_config`` and ``kwargs``; raise one :class:`ConfigError` for all problems.

    ``kwargs`` (what SGLang's factory passes as the second positional argument, an empty dict
    in 0.5.23) may carry kvcr_policy's own keys for programmatic use; it wins over
    ``extra_config``. SGLang's keys are only allowed in ``extra_config``. ``origin`` names where
    ``extra_config`` came from in messages.
    """
    issues: list[ConfigIssue] = []
    if extra_config is not None and not isinstance(extra_config, Mapping):
        message = f"expected a JSON object; got {type(extra_config).__name__}"
        raise ConfigError([ConfigIssue("extra_config", origin, message)])
    sources = [(extra_config or {}, origin), (kwargs or {}, KWARGS_ORIGIN)]
    chosen: dict[str, tuple[Any, str]] = {}
    unknown = UnknownKeys()
    for index, (source, where) in enumerate(sources):
        for key, value in source.items():
            key = str(key)
            if key in OWN_KEYS:
                chosen[key] = _check(key, value, where, issues)
            elif not (index == 0 and _is_sglang_key(key)):
                if not unknown.take(where):
                    continue
                nearest = suggest(key, [*OWN_KEYS, *sorted(SGLANG_KEYS)])
                hint = f"did you mean {nearest!r}? " if nearest else ""
                message = f"unknown key; {hint}({_known()})"
                issues.append(ConfigIssue(f"extra_config.{key}", where, message))
    issues += unknown.rest()
    if issues:
        raise ConfigError(issues, title="invalid kvcr_policy HiCache backend options")
    profile, profile_origin = chosen.get("profile", (None, ""))
    overrides, overrides_origin = chosen.get("overrides", ({}, ""))
    return BackendOptions(
        profile=profile,
        overrides=dict(overrides),
        interface_v1=bool((extra_config or {}).get("interface_v1", 0)),
        profile_origin=profile_origin,
        overrides_origin=overrides_origin,
    )


def override_origins(options: BackendOptions) -> dict[str, str]:
    """Each config path the overrides set -> the extra_config key it came from, e.g.
    ``SGLang --hicache-storage-backend-extra-config ['overrides']['batching']['read_batch_pages']``.
    """
    origins: dict[str, str] = {}

    def walk(value: Any, keys: list[str]) -> None:
        if isinstance(value, Mapping) and value and not (keys and "." in keys[-1]):
            for key, inner in value.items():
                walk(inner, [*keys, str(key)])
            return
        label = "".join(f"[{key!r}]" for key in keys)
        joint = " " if options.overrides_origin.endswith(tuple(FILE_FORMATS)) else ""
        origins[".".join(keys)] = f"{options.overrides_origin}{joint}{label}"

    walk(options.overrides, [])
    return origins
