"""The configuration of a connector or tier at start: loaded with origins that name vLLM's own
flag, the tier chosen for the engine's processes, and one log line per changed value.

**Where the tier lives.** The connector has two halves, the scheduler's (lookups) and each
worker's (the bytes), and vLLM runs them in one process only when the executor is ``uni`` at
one rank. Elsewhere (``mp``, TP or PP above 1) a tier private to one process would answer the
scheduler's lookups with pages the workers never wrote, so ``backend.name = "auto"`` (the
default) means ``host`` there: one tier on the host for every process, through shared memory
(:mod:`kvcr_policy.backends.peer.host_tier`); its origin says why. A private ``dram`` tier named
explicitly in such a set-up is refused with the fix.

Every override's origin names the key it came from (``vLLM --kv-transfer-config
kv_connector_extra_config ['overrides']['placement.capacity_bytes']``), in the effective origins
and in the errors of a load that fails.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from ...config.loading import LoadedConfig, load_config
from ...config.provenance import OVERRIDE
from ...errors import ConfigError, ConfigIssue
from ..sglang.config import BackendOptions, override_origins
from ..sglang.startup import log_changed, profile_origin

__all__ = ["load", "log_start"]

log = logging.getLogger("kvcr_policy.integrations.vllm")


def load(options: BackendOptions, *, shared_by: str | None = None) -> LoadedConfig:
    """:func:`load_config` of ``options``, each override's origin naming its key; ``shared_by``
    (why several processes need the tier, e.g. ``"vLLM executor 'mp'"``) turns ``auto`` into
    ``host`` and refuses ``dram`` (see the module docstring)."""
    if shared_by is not None and _auto_is_private(options):
        why = f"{shared_by}: backend.name 'auto' is 'host' (one tier per host for every process)"
        return _load(options, {"backend.name": "host"}, {"backend.name": why})
    loaded = _load(options, {}, {})
    if shared_by is not None and loaded.config.backend.name == "dram":
        message = (
            f"{shared_by}: the scheduler and the workers run in different processes, so a tier "
            "private to one process would report pages the others never stored; use "
            "backend.name = 'host' (one tier per host, what 'auto' chooses) or 'peer'"
        )
        raise ConfigError([ConfigIssue("backend.name", loaded.origin("backend.name"), message)])
    return loaded


def _auto_is_private(options: BackendOptions) -> bool:
    """Whether ``backend.name`` stays ``auto`` on a copy transport (the private ``dram`` tier);
    read without ``backend.options``, which belong to the host tier once it is chosen."""
    kept = {k: v for k, v in dict(options.overrides).items() if not k.startswith("backend.options")}
    if isinstance(kept.get("backend"), Mapping):
        kept["backend"] = {k: v for k, v in kept["backend"].items() if k != "options"}
    try:
        probe = load_config(options.profile, None, kept)
    except ConfigError:
        return False  # the full load reports what is wrong
    return probe.config.backend.name == "auto" and probe.config.transport.name != "ucx"


def _load(options: BackendOptions, extra: dict[str, Any], origins: dict[str, str]) -> LoadedConfig:
    named = override_origins(options) if options.overrides else {}
    named.update(origins)
    fallback = options.overrides_origin

    def relabel(origin: str, path: str) -> str:
        return (named.get(path) or fallback) if origin == OVERRIDE else origin

    try:
        loaded = load_config(options.profile, None, {**options.overrides, **extra})
    except ConfigError as err:
        issues = [ConfigIssue(i.path, relabel(i.origin, i.path), i.message) for i in err.issues]
        raise ConfigError(issues) from None
    relabelled = {path: relabel(origin, path) for path, origin in loaded.origins.items()}
    return dataclasses.replace(loaded, origins=relabelled)


def log_start(what: str, options: BackendOptions, loaded: LoadedConfig) -> None:
    """One line naming ``what`` started, the profile and where it was named; one line per
    value that differs from the schema default, with its origin."""
    where = profile_origin(options, loaded)
    log.info("kvcr_policy %s: profile %s (from %s)", what, loaded.profile or "default", where)
    log_changed(loaded)
