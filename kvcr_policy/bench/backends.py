"""The backend axis: the built-in bench adapters and every adapter plugins register.

``dram`` and ``peer`` are built in; a plugin adds its backend's adapter (a
:class:`~kvcr_policy.bench_adapter.BenchBackend`) with the ``kvcr_register_bench_backends``
hook, called here only, when a run resolves its backend.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from ..bench_adapter import BenchBackend
from ..config.loading import LoadedConfig
from ..errors import BenchError
from ..geometry import PoolGeometry
from ..plugins import make_plugin_manager
from .server import PeerProcess
from .setup import BenchSetup

__all__ = [
    "BUILTIN",
    "BenchBackend",
    "DramBench",
    "PeerBench",
    "bench_backends",
    "default_backend",
]


class DramBench(BenchBackend):
    """The process-owned DRAM tier: nothing to start; each pipeline opens its own tier."""

    name = "dram"
    targets = frozenset({"cpu", "cuda"})
    limit_text = "one contiguous copy of the same bytes, tier -> pool, same transport"
    limit_short = "one contiguous copy, same transport"


class PeerBench(BenchBackend):
    """A ``kvcr-policy serve`` process per side on loopback, reached over UCX, or through the
    tier's shared memory (the default on one host: see docs/peer.md)."""

    name = "peer"
    needs: ClassVar[Mapping[str, str]] = {"ucxx": "pip install 'kvcr-policy[ucx]'"}
    limit_text = "one UCX message of the same bytes, peer tier -> pool, same two processes"
    limit_short = "one UCX message"

    def __init__(self, setup: BenchSetup) -> None:
        super().__init__(setup)
        self.servers: dict[str, dict[str, Any]] = {}
        wanted = str((setup.overrides or {}).get("transport.options.shared_memory", "auto"))
        if setup.tls != "tcp" and wanted != "off":  # the client maps the peer's tier
            self.limit_text = (
                "one memory copy of the same bytes, the peer's shared tier -> pool, by the "
                "client's copy engine"
            )
            self.limit_short = "one copy from the shared tier"

    def _transport(self) -> dict[str, Any]:
        return {
            "transport.name": "ucx",
            "transport.options.tls": self.setup.tls,
            "transport.options.net_devices": "lo",
        }

    def planned(self) -> dict[str, Any]:
        # Any address validates; the real one is known once the server listens.
        return {**self._transport(), "transport.options.peer": "127.0.0.1:1"}

    @contextmanager
    def start(self, label: str, profile: str, geometry: PoolGeometry) -> Iterator[dict[str, Any]]:
        from ..backends.peer.server.tiers import tier_bytes

        # --set reaches the server too: placement and tier settings live there. The tier holds
        # every page of the pool, small pages included (each slot costs at least SLOT_COST).
        sets = {
            **self._transport(),
            "placement.capacity_bytes": tier_bytes(geometry.pages, geometry.page_bytes),
            **(self.setup.overrides or {}),
        }
        server = PeerProcess(sets, profile=profile)
        try:
            yield {**self._transport(), "transport.options.peer": server.address}
        finally:
            self.servers[label] = {"address": server.address, "exit_code": server.stop()}

    def describe(self, transport: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "tls": self.setup.tls,
            "transport_used": transport.get("transport_used"),
            "peer": dict(self.servers),
        }


BUILTIN: dict[str, type[BenchBackend]] = {"dram": DramBench, "peer": PeerBench}


def bench_backends(loaded: LoadedConfig | None = None) -> dict[str, type[BenchBackend]]:
    """Every adapter ``--backend`` may name: the built-ins and those the plugins register.

    The plugins are those ``loaded`` was validated with (every installed one without it).
    """
    found = dict(BUILTIN)
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
