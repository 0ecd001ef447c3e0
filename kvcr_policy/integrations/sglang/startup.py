"""The backend's configuration at start: loaded with origins that name SGLang's own flag, and
logged once.

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

from ...errors import ConfigError, ConfigIssue
from ...loading import PROFILE_ENV, LoadedConfig, load_config
from ...provenance import OVERRIDE
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


def load(options: BackendOptions) -> LoadedConfig:
    """:func:`load_config` of the options, each override's origin naming its extra_config key."""
    named = override_origins(options) if options.overrides else {}
    fallback = options.overrides_origin
    try:
        loaded = load_config(options.profile, None, options.overrides)
    except ConfigError as err:
        issues = [
            ConfigIssue(i.path, _relabel(i.origin, i.path, named, fallback), i.message)
            for i in err.issues
        ]
        raise ConfigError(issues) from None
    origins = {p: _relabel(o, p, named, fallback) for p, o in loaded.origins.items()}
    return dataclasses.replace(loaded, origins=origins)


def log_start(backend: Any) -> None:
    """One line with the rank, the profile and where it was named; one per changed value."""
    c, options, loaded = backend.storage_config, backend.options, backend.loaded
    if options.profile is not None:
        where = options.profile_origin
    elif loaded.profile is not None:
        where = f"env {PROFILE_ENV}"
    else:
        where = "no profile named: schema defaults, upstream behaviour"
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
        where,
        int(options.interface_v1),
    )
    for path, (value, origin) in loaded.changed().items():
        log.info("kvcr_policy: %s = %r (from %s)", path, value, origin)
    if getattr(c, "should_split_heads", False):
        log.warning(
            "kvcr_policy: tp_lcm_size asks for split-head page sharing between TP sizes; "
            "not supported: each TP size keeps its own pages"
        )
