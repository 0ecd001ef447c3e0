"""The ``kv_connector_extra_config`` of the vLLM connector, and the offloading tier's config.

vLLM passes ``--kv-transfer-config``'s ``kv_connector_extra_config`` (a JSON object) to the
connector; the secondary tier gets the keys of its ``secondary_tiers`` entry as keyword
arguments. kvcr_policy reads the same two keys as the SGLang backend (:data:`OWN_KEYS`):
``profile`` (a bundled name or a path) and ``overrides`` (dotted paths or nested tables, as a
JSON object, JSON text or ``@FILE``). Anything else is a typo and is refused with the known keys,
so that a misspelt ``"profil"`` cannot silently run the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ...config.sources import suggest
from ...errors import ConfigError, ConfigIssue
from ..sglang.config import OWN_KEYS, BackendOptions
from ..sglang.flag import read_object

__all__ = [
    "CONNECTOR_ORIGIN",
    "OWN_KEYS",
    "TIER_ORIGIN",
    "BackendOptions",
    "connector_config_for",
    "parse_options",
]

CONNECTOR_ORIGIN: Final = "vLLM --kv-transfer-config kv_connector_extra_config"
TIER_ORIGIN: Final = "vLLM kv_connector_extra_config secondary_tiers entry"

#: The class vLLM loads through ``kv_connector_module_path``.
CONNECTOR: Final = {
    "kv_connector": "KVCRPolicyConnector",
    "kv_connector_module_path": "kvcr_policy.integrations.vllm",
    "kv_role": "kv_both",
}


def connector_config_for(
    profile: str | None = None, overrides: Mapping[str, Any] | str | None = None
) -> dict[str, Any]:
    """The ``--kv-transfer-config`` object selecting the connector with ``profile`` and
    ``overrides`` (a mapping, JSON text or ``@FILE``); checked as the connector will check it."""
    extra: dict[str, Any] = {}
    if profile is not None:
        extra["profile"] = profile
    if overrides:
        extra["overrides"] = dict(overrides) if isinstance(overrides, Mapping) else overrides
    parse_options(extra)
    return {**CONNECTOR, "kv_connector_extra_config": extra}


def parse_options(
    extra: Mapping[str, Any] | None,
    *,
    origin: str = CONNECTOR_ORIGIN,
    tolerated: frozenset[str] = frozenset(),
) -> BackendOptions:
    """Validate ``extra``; raise one :class:`ConfigError` naming every problem.

    ``tolerated``: keys that belong to the engine, not to kvcr_policy (the tier's ``type`` and
    ``module_path``), skipped here.
    """
    if extra is not None and not isinstance(extra, Mapping):
        message = f"expected a JSON object; got {type(extra).__name__}"
        raise ConfigError([ConfigIssue("extra_config", origin, message)])
    issues: list[ConfigIssue] = []
    profile: str | None = None
    profile_origin = overrides_origin = ""
    overrides: dict[str, Any] = {}
    for key, value in (extra or {}).items():
        key = str(key)
        where = f"{origin} [{key!r}]"
        if key == "profile":
            if isinstance(value, str) and value.strip():
                profile, profile_origin = value, where
            else:
                message = f"expected {OWN_KEYS['profile']}; got {value!r}"
                issues.append(ConfigIssue(key, origin, message))
        elif key == "overrides":
            try:
                overrides = dict(read_object(value, key, origin))
            except ConfigError as err:
                issues.extend(err.issues)
            overrides_origin = where
            if isinstance(value, str) and value.strip().startswith("@"):
                overrides_origin = f"{where} {value.strip()}"
        elif key not in tolerated:
            nearest = suggest(key, [*OWN_KEYS])
            hint = f"did you mean {nearest!r}? " if nearest else ""
            message = f"unknown key; {hint}(kvcr_policy reads {', '.join(OWN_KEYS)})"
            issues.append(ConfigIssue(key, origin, message))
    if issues:
        raise ConfigError(issues, title="invalid kvcr_policy vLLM options")
    return BackendOptions(
        profile=profile,
        overrides=overrides,
        profile_origin=profile_origin,
        overrides_origin=overrides_origin,
    )
