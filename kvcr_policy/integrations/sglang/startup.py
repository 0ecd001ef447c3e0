"""The backend's configuration at start: loaded with origins that name SGLang's own flag, and
logged once.

**One tier per host at TP > 1.** SGLang writes MLA pages from TP rank 0 only
(``is_storage_writer``) and uses the minimum of the ranks' hit counts
(``_sync_prefetch_hit_query``, ``ReduceOp.MIN``), so a tier private to each rank's process
would never serve a hit. With ``backend.name = "auto"`` (the default), an MLA model at TP > 1
therefore gets the ``host`` backend: one tier on the host for every rank, through shared memory
(:mod:`kvcr_policy.backends.peer.host_tier`); its origin says why. A per-process ``dram`` tier
named explicitly for an MLA model at TP > 1 is refused with the fix. An MHA model keeps a tier
per rank (each rank stores and reads its own shard, as before), unless ``host`` is named.

The loader labels every caller override ``override``; here each one is relabelled with the
``extra_config`` key it came from (``SGLang --hicache-storage-backend-extra-config
['overrides']['placement.capacity_bytes']``), in the effective origins and in the errors of a
load that fails, so a user can find the value to fix. When SGLang read the flag from a file
(``@/etc/kvcr/sglang.toml``), the origin names the file too.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ...config.loading import LoadedConfig, load_config
from ...config.provenance import OVERRIDE
from ...config.selection import PROFILE_ENV
from ...errors import ConfigError, ConfigIssue
from .config import EXTRA_CONFIG_ORIGIN, BackendOptions, override_origins

__all__ = ["flag_origin", "load", "log_start"]

log = logging.getLogger("kvcr_policy.integrations.sglang")


def flag_origin() -> str:
    """SGLang's flag, with the file it read when it was given as ``@FILE`` (from the server
    args SGLang published in this process; none in tests or outside a server)."""
    try:
        from sglang.srt.runtime_context import get_memory

        raw = get_memory().hicache_storage_backend_extra_config
    except Exception:  # no server args published: a test, a bench, a notebook
        return EXTRA_CONFIG_ORIGIN
    if isinstance(raw, str) and raw.startswith("@"):
        return f"{EXTRA_CONFIG_ORIGIN} {raw}"
    return EXTRA_CONFIG_ORIGIN


def _relabel(origin: str, path: str, named: dict[str, str], fallback: str) -> str:
    if origin != OVERRIDE:
        return origin
    return named.get(path) or fallback


def shares_pages(storage_config: Any) -> bool:
    """Whether the ranks of this engine read pages one rank wrote: an MLA model at TP > 1."""
    c = storage_config
    return bool(getattr(c, "is_mla_model", False)) and int(c.tp_size) > 1


def load(options: BackendOptions, storage_config: Any = None) -> LoadedConfig:
    """:func:`load_config` of the options, each override's origin naming its extra_config key;
    for an MLA model at TP > 1, ``auto`` means the host tier (see the module docstring)."""
    if storage_config is None:
        return _load(options, {}, {})
    if shares_pages(storage_config) and _auto_is_dram(options):
        why = (
            f"SGLang MLA at tp {storage_config.tp_size}: backend.name 'auto' is 'host' (one "
            "tier per host for every rank: SGLang writes MLA pages from TP rank 0 only)"
        )
        return _load(options, {"backend.name": "host"}, {"backend.name": why})
    loaded = _load(options, {}, {})
    config = loaded.config
    if shares_pages(storage_config) and config.backend.name == "dram":
        origin = loaded.origin("backend.name")
        message = (
            f"a tier private to each rank's process cannot serve an MLA model at tp "
            f"{storage_config.tp_size}: SGLang writes MLA pages from TP rank 0 only and counts "
            "the fewest hits of any rank, so no rank would ever hit; use backend.name = 'host' "
            "(one tier per host, what 'auto' chooses for MLA at TP > 1) or 'peer'"
        )
        raise ConfigError([ConfigIssue("backend.name", origin, message)])
    return loaded


def _auto_is_dram(options: BackendOptions) -> bool:
    """Whether the configuration leaves ``backend.name`` at ``auto`` on a copy transport (the
    private ``dram`` tier). Read without ``backend.options``: those are the host tier's when it
    is chosen, and the private tier would refuse them."""
    try:
        probe = load_config(options.profile, None, _without_backend_options(options.overrides))
    except ConfigError:
        return False  # the full load reports what is wrong
    return probe.config.backend.name == "auto" and probe.config.transport.name != "ucx"


def _without_backend_options(overrides: Any) -> dict[str, Any]:
    kept: dict[str, Any] = {}
    for key, value in dict(overrides).items():
        if str(key).startswith("backend.options"):
            continue
        if key == "backend" and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k != "options"}
        kept[key] = value
    return kept


def _load(options: BackendOptions, extra: dict[str, Any], origins: dict[str, str]) -> LoadedConfig:
    named = override_origins(options) if options.overrides else {}
    named.update(origins)
    fallback = options.overrides_origin
    try:
        loaded = load_config(options.profile, None, {**options.overrides, **extra})
    except ConfigError as err:
        issues = [
            ConfigIssue(i.path, _relabel(i.origin, i.path, named, fallback), i.message)
            for i in err.issues
        ]
        raise ConfigError(issues) from None
    origins = {p: _relabel(o, p, named, fallback) for p, o in loaded.origins.items()}
    return dataclasses.replace(loaded, origins=origins)


def profile_origin(options: BackendOptions, loaded: LoadedConfig) -> str:
    """Where the profile in use was named: the engine's options, the environment, or none."""
    if options.profile is not None:
        return options.profile_origin
    if loaded.profile is not None:
        return f"env {PROFILE_ENV}"
    return "no profile named: schema defaults, upstream behaviour"


def log_changed(loaded: LoadedConfig) -> None:
    """One line per value that differs from the schema default, with its origin."""
    for path, (value, origin) in loaded.changed().items():
        log.info("kvcr_policy: %s = %r (from %s)", path, value, origin)


def log_start(backend: Any) -> None:
    """One line with the rank, the profile and where it was named; one per changed value."""
    c, options, loaded = backend.storage_config, backend.options, backend.loaded
    log.info(
        "kvcr_policy HiCache backend for model %r, tp %d/%d, pp %d/%d, attn-cp %d/%d, dp %d: "
        "profile %s (from %s), interface_v1=%s",
        c.model_name,
        c.tp_rank,
        c.tp_size,
        c.pp_rank,
        c.pp_size,
        c.attn_cp_rank,
        c.attn_cp_size,
        getattr(c, "dp_rank", 0),
        loaded.profile or "default",
        profile_origin(options, loaded),
        int(options.interface_v1),
    )
    log_changed(loaded)
    if getattr(c, "should_split_heads", False):
        log.warning(
            "kvcr_policy: tp_lcm_size asks for split-head page sharing between TP sizes; "
            "not supported: each TP size keeps its own pages"
        )
