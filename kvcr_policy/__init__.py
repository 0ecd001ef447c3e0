"""kvcr_policy: configuration-driven delivery and placement policies for KV-cache tiers."""

from __future__ import annotations

from .config.loading import LoadedConfig, load_config
from .config.schema import PolicyConfig
from .errors import (
    ClosedError,
    ConfigError,
    KVCRPolicyError,
    PlacementError,
    PluginError,
    PoolError,
    TransportError,
)
from .hookspecs import hookimpl
from .plugins import make_plugin_manager

__all__ = [
    "ClosedError",
    "ConfigError",
    "KVCRPolicyError",
    "LoadedConfig",
    "PlacementError",
    "PluginError",
    "PolicyConfig",
    "PoolError",
    "TransportError",
    "build_pipeline",
    "hookimpl",
    "load_config",
    "make_plugin_manager",
]


def __getattr__(name: str) -> object:
    # The engine imports numpy-heavy modules; config-only users should not pay for them.
    if name == "build_pipeline":
        from .pipeline import build_pipeline

        return build_pipeline
    raise AttributeError(name)
