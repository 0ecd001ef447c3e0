"""make_plugin_manager: built-ins, entry points, allow and block lists, strict mode.

Built-in strategies are plugins registered through the same :func:`_add_plugin` call as
third-party ones found in the ``kvcr_policy`` entry-point group. A fresh manager is built per
call (no module-global manager), so two pipelines with different plugin settings never share
state.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from typing import Any

import pluggy
from pydantic import BaseModel

from . import hookspecs
from .config.schema import ENV_PREFIX, PluginsSection, PolicyConfig
from .errors import PluginError
from .registry import KINDS, BrokenPlugin, NoOptions, Registry, Spec

__all__ = ["BUILTIN_PLUGINS", "ENTRY_POINT_GROUP", "PluginManager", "make_plugin_manager"]

log = logging.getLogger("kvcr_policy.plugins")

ENTRY_POINT_GROUP = "kvcr_policy"
TRACE_ENV = ENV_PREFIX + "TRACE_HOOKS"

#: Modules of the built-in plugins, registered exactly like third-party ones: the strategies,
#: then each built-in backend's own hooks (named, not imported, here: removing a backend is
#: removing its line).
BUILTIN_PLUGINS: tuple[str, ...] = (
    "kvcr_policy.builtin.batching",
    "kvcr_policy.builtin.coalescing",
    "kvcr_policy.builtin.placement",
    "kvcr_policy.builtin.thread_tuning",
    "kvcr_policy.builtin.fallback",
    "kvcr_policy.builtin.eviction",
    "kvcr_policy.builtin.admission",
    "kvcr_policy.backends.dram.hooks",
    "kvcr_policy.backends.peer.hooks",
    "kvcr_policy.backends.file.hooks",
    "kvcr_policy.backends.cascade.hooks",
)


class PluginManager(pluggy.PluginManager):
    """A pluggy manager that also holds the registry its plugins filled."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs)
        self.registry = Registry()
        self.providers: dict[str, tuple[str, str]] = {}

    def call_safely(self, hook: str, **kwargs: Any) -> None:
        """Call a notification hook; an observer's exception is logged, never raised."""
        for impl in getattr(self.hook, hook).get_hookimpls():
            try:
                impl.function(**kwargs)
            except Exception:  # an observer must never break the data path
                log.exception("plugin %r failed in %s; ignored", impl.plugin_name, hook)


def builtin_name(module: str) -> str:
    """The plugin name of a built-in module: ``builtin.batching`` for
    ``kvcr_policy.builtin.batching``, ``builtin.dram`` for ``kvcr_policy.backends.dram.hooks``."""
    parts = module.split(".")
    return "builtin." + (parts[-2] if parts[-1] == "hooks" else parts[-1])


def _version() -> str:
    try:
        return metadata.version("kvcr-policy")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def _registrar(pm: PluginManager, plugin: str, kind_fixed: str | None) -> Callable[..., None]:
    distribution, version = pm.providers[plugin]

    def register(*args: Any, options: type[BaseModel] = NoOptions, description: str = "") -> None:
        if kind_fixed is None:
            kind, name, factory = args
            if kind not in KINDS:
                message = (
                    f"plugin {plugin!r} registered a strategy of unknown kind {kind!r}; "
                    f"kinds are {', '.join(KINDS)}"
                )
                raise PluginError(message, plugin=plugin, distribution=distribution)
        else:
            kind = kind_fixed
            name, factory = args
        if not (isinstance(options, type) and issubclass(options, BaseModel)):
            message = f"plugin {plugin!r}: options of {kind} {name!r} must be a pydantic model"
            raise PluginError(message, plugin=plugin, distribution=distribution)
        doc = description or (getattr(factory, "__doc__", None) or "").strip().split("\n")[0]
        spec = Spec(kind, name, factory, options, doc, plugin, distribution, version)
        pm.registry.add(spec)

    return register


def _collect(pm: PluginManager, plugin: str) -> None:
    """Run one plugin's register hooks, attributing what it registers to it."""
    others = [p for p in pm.get_plugins() if pm.get_name(p) != plugin]
    strategies = pm.subset_hook_caller("kvcr_register_strategies", remove_plugins=others)
    strategies(register=_registrar(pm, plugin, None))
    transports = pm.subset_hook_caller("kvcr_register_transports", remove_plugins=others)
    transports(register=_registrar(pm, plugin, "transport"))
    backends = pm.subset_hook_caller("kvcr_register_backends", remove_plugins=others)
    backends(register=_registrar(pm, plugin, "backend"))


def _add_plugin(
    pm: PluginManager, obj: object, name: str, distribution: str, version: str, strict: bool
) -> None:
    """Register one plugin, built-in or third-party alike; report and skip it if it is broken."""
    snapshot = dict(pm.registry.specs)
    try:
        pm.providers[name] = (distribution, version)
        pm.register(obj, name=name)
        _collect(pm, name)
    except Exception as err:
        pm.registry.specs = snapshot
        if pm.is_registered(obj):
            pm.unregister(obj)
        reason = f"{type(err).__name__}: {err}"
        if strict:
            message = (
                f"plugin {name!r} ({distribution} {version}) failed to register: {reason} "
                "(plugins.strict is true; set it false to skip broken plugins)"
            )
            raise PluginError(message, plugin=name, distribution=distribution) from err
        log.warning("plugin %r (%s) skipped: %s", name, distribution, reason)
        pm.registry.broken.append(BrokenPlugin(name, distribution, reason))


def make_plugin_manager(
    config: PolicyConfig | None = None, environ: Mapping[str, str] | None = None
) -> PluginManager:
    """A fresh plugin manager with the built-in and the installed plugins registered.

    Third-party plugins come from the ``kvcr_policy`` entry-point group; ``plugins.allow``
    lists the only ones to load, ``plugins.block`` those never to load; built-ins always load.
    Both are read from ``config`` only (``load_config`` fills them from a profile or from
    ``KVCR_POLICY_PLUGINS`` / ``KVCR_POLICY_DISABLE_PLUGINS``), so the manager that builds a
    pipeline loads exactly the plugins its configuration was validated with. A plugin that
    fails to import or register is reported in ``registry.broken`` and skipped, or raises
    :class:`PluginError` when ``plugins.strict`` is true. ``KVCR_POLICY_TRACE_HOOKS=1`` in
    ``environ`` (default ``os.environ``) prints every hook call to stderr.
    """
    env = os.environ if environ is None else environ
    section = config.plugins if config is not None else PluginsSection()
    allow = section.allow
    block = set(section.block)

    pm = PluginManager()
    if env.get(TRACE_ENV, "").strip() not in {"", "0", "false", "no"}:
        pm.trace.root.setwriter(sys.stderr.write)
        pm.enable_tracing()

    version = _version()
    for module_name in BUILTIN_PLUGINS:
        module = importlib.import_module(module_name)
        name = builtin_name(module_name)
        _add_plugin(pm, module, name, "kvcr-policy", version, strict=True)

    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        dist = ep.dist.name if ep.dist is not None else "<unknown>"
        dist_version = ep.dist.version if ep.dist is not None else "?"
        if ep.name in block or (allow is not None and ep.name not in allow):
            why = "blocked by plugins.block" if ep.name in block else "not in plugins.allow"
            pm.registry.broken.append(BrokenPlugin(ep.name, dist, why, blocked=True))
            continue
        try:
            obj = ep.load()
        except Exception as err:
            reason = f"import failed: {type(err).__name__}: {err}"
            if section.strict:
                message = (
                    f"plugin {ep.name!r} ({dist} {dist_version}, {ep.value}) {reason} "
                    "(plugins.strict is true; set it false to skip broken plugins)"
                )
                raise PluginError(message, plugin=ep.name, distribution=dist) from err
            log.warning("plugin %r (%s) skipped: %s", ep.name, dist, reason)
            pm.registry.broken.append(BrokenPlugin(ep.name, dist, reason))
            continue
        _add_plugin(pm, obj, ep.name, dist, dist_version, strict=section.strict)
    return pm
