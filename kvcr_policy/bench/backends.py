"""The backend axis: the bench adapter every backend registers.

Each backend adds its adapter (a :class:`~kvcr_policy.bench_adapter.BenchBackend`) with the
``kvcr_register_bench_backends`` hook, the built-in ones as a plugin does (``dram`` and
``peer``: :mod:`kvcr_policy.backends.dram.bench`, :mod:`kvcr_policy.backends.peer.bench`);
the hook is called here only, when a run resolves its backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..bench_adapter import BenchBackend
from ..config.loading import LoadedConfig
from ..errors import BenchError
from ..plugins import make_plugin_manager

__all__ = ["BenchBackend", "bench_backends", "default_backend"]


def bench_backends(loaded: LoadedConfig | None = None) -> dict[str, type[BenchBackend]]:
    """Every adapter ``--backend`` may name: those the built-in backends and the plugins register.

    The plugins are those ``loaded`` was validated with (every installed one without it).
    """
    found: dict[str, type[BenchBackend]] = {}
    pm = make_plugin_manager(None if loaded is None else loaded.config)

    def register(adapter: type[BenchBackend]) -> None:
        name = getattr(adapter, "name", None)
        if not (isinstance(adapter, type) and issubclass(adapter, BenchBackend)) or not name:
            message = (
                f"a plugin registered {adapter!r} as a bench backend: not a named BenchBackend"
            )
            raise BenchError(message)
        if name in found and found[name] is not adapter:
            message = (
                f"bench backend {name!r} is registered twice ({found[name].__module__} and "
                f"{adapter.__module__}); block one plugin with KVCR_POLICY_DISABLE_PLUGINS"
            )
            raise BenchError(message)
        found[name] = adapter

    pm.hook.kvcr_register_bench_backends(register=register)
    return found


def default_backend(loaded: LoadedConfig, known: Mapping[str, Any] | None = None) -> str:
    """The backend a profile implies: the one it names, when the benchmark knows it; else
    ``peer`` when its transport is ``ucx``, else ``dram``."""
    named = loaded.config.backend.name
    if named in (bench_backends(loaded) if known is None else known):
        return named
    return "peer" if loaded.config.transport.name == "ucx" else "dram"
