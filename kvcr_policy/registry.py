"""Named strategy and transport factories, with their options models and who provided them."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from .errors import PluginError
from .values import shorten

__all__ = [
    "KINDS",
    "BrokenPlugin",
    "Lazy",
    "NoOptions",
    "RegisterBackend",
    "RegisterBenchBackend",
    "RegisterNamed",
    "RegisterStrategy",
    "RegisterTransport",
    "Registry",
    "Spec",
]

#: Strategy kinds a plugin may register, in the order `kvcr-policy plugins` lists them.
KINDS = ("batching", "coalescing", "placement", "thread_tuning", "fallback", "eviction")


class NoOptions(BaseModel):
    """The options model of a strategy that takes none: any key is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class RegisterStrategy(Protocol):
    def __call__(
        self,
        kind: str,
        name: str,
        factory: Callable[..., Any],
        *,
        options: type[BaseModel] = ...,
        description: str = ...,
    ) -> None: ...


class RegisterNamed(Protocol):
    """``register(name, factory, options=..., description=...)``: what the transport and the
    backend hooks are handed (the kind is the hook's)."""

    def __call__(
        self,
        name: str,
        factory: Callable[..., Any],
        *,
        options: type[BaseModel] = ...,
        description: str = ...,
    ) -> None: ...


#: ``kvcr_register_transports``' and ``kvcr_register_backends``' callbacks: one shape.
RegisterTransport = RegisterNamed
RegisterBackend = RegisterNamed


class RegisterBenchBackend(Protocol):
    """``register(adapter)``: a :class:`kvcr_policy.bench_adapter.BenchBackend` subclass."""

    def __call__(self, adapter: type[Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class Lazy:
    """A factory whose module is imported only when something is built (never when a plugin
    registers it), with what the registry asks of a backend's factory before building one."""

    module: str
    name: str
    #: What the backend lets a coalescing strategy use under a config
    #: (:meth:`Registry.capabilities`).
    capabilities_for: Callable[[Any, Registry], frozenset[str]] | None = None
    #: It maps a tier of ``placement.capacity_bytes`` per pool on this host
    #: (:meth:`Registry.maps_tiers`).
    maps_tiers: bool = False

    def __call__(self, *args: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.name)(*args)


@dataclass(frozen=True, slots=True)
class Spec:
    """One registered factory: what it makes, its options model, and its provider."""

    kind: str
    name: str
    factory: Callable[..., Any]
    options: type[BaseModel]
    description: str
    plugin: str
    distribution: str
    version: str

    def create(self, *args: Any, options: dict[str, Any] | None = None) -> Any:
        """Build the strategy or transport from validated ``options`` (a dict)."""
        model = self.options.model_validate(options or {})
        return self.factory(*args, model)


@dataclass(frozen=True, slots=True)
class BrokenPlugin:
    """A plugin that was blocked, or failed to import or to register, and why."""

    name: str
    distribution: str
    reason: str
    blocked: bool = False


@dataclass
class Registry:
    """Every factory registered by the plugins of one plugin manager."""

    specs: dict[tuple[str, str], Spec] = field(default_factory=dict)
    broken: list[BrokenPlugin] = field(default_factory=list)

    def add(self, spec: Spec) -> None:
        key = (spec.kind, spec.name)
        if key in self.specs:
            first = self.specs[key]
            message = (
                f"{spec.kind} {spec.name!r} is registered twice: by plugin {first.plugin!r} "
                f"({first.distribution}) and by plugin {spec.plugin!r} ({spec.distribution}); "
                "block one of them with KVCR_POLICY_DISABLE_PLUGINS"
            )
            # The error is about the plugin that came second: it is the one refused.
            raise PluginError(message, plugin=spec.plugin, distribution=spec.distribution)
        self.specs[key] = spec

    def find(self, kind: str, name: str) -> Spec | None:
        return self.specs.get((kind, name))

    def get(self, kind: str, name: str) -> Spec:
        spec = self.find(kind, name)
        if spec is None:
            names = ", ".join(self.names(kind)) or "none"
            message = f"no {kind} named {shorten(name)} is registered (registered: {names})"
            raise PluginError(message, plugin=None, distribution=None)
        return spec

    def backend_for(self, backend: str, transport: str) -> str:
        """The backend that ``backend.name`` means: itself, or for ``auto`` the backend the
        transport class declares (its ``backend`` attribute; ``dram`` when it has none)."""
        if backend != "auto":
            return backend
        spec = self.find("transport", transport)
        return str(getattr(spec.factory, "backend", "dram")) if spec is not None else "dram"

    def capabilities(self, config: Any) -> frozenset[str]:
        """What the configured backend lets a coalescing strategy use, without building it.

        The backend factory says: its ``capabilities_for(config, registry)`` when it has one
        (``dram``: those of its copy transport), else its ``capabilities``; a factory that
        declares neither lets nothing through, as a backend with empty ``capabilities`` does.
        """
        name = self.backend_for(config.backend.name, config.transport.name)
        factory = self.get("backend", name).factory
        ask = getattr(factory, "capabilities_for", None)
        if ask is not None:
            return frozenset(ask(config, self))
        return frozenset(getattr(factory, "capabilities", ()))

    def maps_tiers(self, config: Any) -> bool:
        """Whether the configured backend maps a tier of ``placement.capacity_bytes`` per pool
        from this host's memory (its factory's ``maps_tiers``; ``dram`` does, in the calling
        process, ``host`` in the host tier's process; a peer's client does not: its ``serve``
        may be elsewhere), so that memory pre-flight applies to it here."""
        name = self.backend_for(config.backend.name, config.transport.name)
        return bool(getattr(self.get("backend", name).factory, "maps_tiers", False))

    def names(self, kind: str) -> list[str]:
        return sorted(name for k, name in self.specs if k == kind)

    def by_kind(self) -> dict[str, list[Spec]]:
        kinds: dict[str, list[Spec]] = {kind: [] for kind in (*KINDS, "transport", "backend")}
        for spec in sorted(self.specs.values(), key=lambda s: (s.kind, s.name)):
            kinds.setdefault(spec.kind, []).append(spec)
        return kinds
