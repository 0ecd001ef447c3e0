"""A ``--hicache-storage-backend-extra-config`` value checked the way SGLang's dynamic loader
and this backend read it, on a machine without SGLang (``kvcr-policy sglang-config --check``).

Bad JSON, an unreadable file, a loader key missing or naming another backend, an unknown key,
a profile that does not load or a tier (``placement.capacity_bytes``) larger than this host or
its memory cgroup raise one :class:`~kvcr_policy.errors.KVCRPolicyError` listing every problem.
The value is checked as one :class:`EngineRank` loads it: for an MLA model at TP > 1 ``auto``
is the host tier (one for every rank), and a tier private to each rank is refused with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ...config.preflight import check_host_fit
from ...errors import ConfigError, ConfigIssue
from ...values import shorten
from .config import EXTRA_CONFIG_ORIGIN, LOADER_KEYS, parse_extra_config
from .flag import read_flag
from .startup import load

__all__ = ["MODULES", "EngineRank", "check_flag"]

#: The modules SGLang's loader may import this backend's class from (the package re-exports it).
MODULES = ("kvcr_policy.integrations.sglang", "kvcr_policy.integrations.sglang.storage")


@dataclass(frozen=True, slots=True)
class EngineRank:
    """The engine a flag is checked for: its tensor- and pipeline-parallel sizes, and whether
    the model is MLA (one latent head, the same on every rank)."""

    tp: int = 1
    pp: int = 1
    mla: bool = False


def loader_issues(extra: dict[str, Any]) -> list[ConfigIssue]:
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


def check_flag(value: str, rank: EngineRank) -> dict[str, Any]:
    """What the backend will run with, given the flag ``value`` (JSON text or ``@FILE``) on
    ``rank``; every problem SGLang or the backend would meet raises, all of them at once."""
    extra = read_flag(value)
    issues = loader_issues(extra)
    try:
        options = parse_extra_config(extra)
    except ConfigError as err:  # every problem of the flag at once
        raise ConfigError([*issues, *err.issues], title="SGLang would not load this") from None
    if issues:
        raise ConfigError(issues, title="SGLang would not load this backend with this flag")
    engine = SimpleNamespace(
        tp_size=rank.tp, pp_size=rank.pp, attn_cp_size=1, is_mla_model=rank.mla
    )
    loaded = load(options, engine)
    check_host_fit(loaded)  # a tier larger than this host: exit 2 here, not killed at start
    warnings = []
    if not options.interface_v1:
        warnings.append(
            "interface_v1 is off: SGLang then moves pages through the v0 API (page tensors, two "
            'extra copies per page), its slower path; set "interface_v1": 1'
        )
    return {
        "loads": True,
        "interface_v1": options.interface_v1,
        "warnings": warnings,
        "profile": loaded.profile or "default",
        "backend": {"name": loaded.config.backend.name, "from": loaded.origin("backend.name")},
        "changed": {path: {"value": v, "from": o} for path, (v, o) in loaded.changed().items()},
    }
