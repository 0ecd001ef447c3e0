"""The peer backend's benchmark adapter (registered by :mod:`.hooks`): a ``kvcr-policy serve``
process per side."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from kvcr_policy.bench_adapter import BenchBackend, BenchSetup
from kvcr_policy.geometry import PoolGeometry

from .process import PeerProcess

__all__ = ["PeerBench"]


class PeerBench(BenchBackend):
    """A ``kvcr-policy serve`` process per side on loopback, reached over UCX, or through the
    tier's shared memory (the default on one host: see docs/peer.md)."""

    name = "peer"
    needs: ClassVar[Mapping[str, str]] = {
        "ucxx": "pip install torch==2.13.0 -e '.[ucx]' in the kvcr-policy clone"
    }
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
        from .server.tiers import tier_bytes

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
