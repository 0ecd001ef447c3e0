"""The backend axis: how the benchmark starts a tier backend and measures its limit.

A :class:`BenchBackend` is the small piece a new tier backend adds to be benchmarked: the
targets it supports, the optional modules it needs (checked before anything starts), how to
start one instance of it for one side (a server process, a daemon; nothing for the in-process
DRAM tier) and which overrides point a pipeline at that instance, and its limit: by default
the time of :meth:`Pipeline.probe <kvcr_policy.pipeline.Pipeline.probe>`, the backend's
largest single move of the same bytes from its tier into the pool. Register it in
:data:`BACKENDS` under the name ``--backend`` selects. A backend from a plugin distribution
(``mooncake``) imports it only when a run starts, and names it in :attr:`BenchBackend.needs`.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from importlib.util import find_spec
from typing import Any, ClassVar

from ..geometry import PoolGeometry
from ..loading import LoadedConfig
from ..pipeline import Pipeline
from .server import PeerProcess
from .setup import BenchError, BenchSetup

__all__ = [
    "BACKENDS",
    "BenchBackend",
    "DramBackend",
    "KvcrBackend",
    "MooncakeBackend",
    "PeerBackend",
    "default_backend",
]


class BenchBackend:
    """How one tier backend is started and measured; one object per benchmark run."""

    name: ClassVar[str]
    #: Targets whose pools this backend can serve.
    targets: ClassVar[frozenset[str]] = frozenset({"cpu"})
    #: Optional modules it needs -> how to install them.
    needs: ClassVar[Mapping[str, str]] = {}
    #: What the limit is, in words (the JSON's ``limit``).
    limit_text: ClassVar[str] = "one move of the same bytes, tier -> pool (Pipeline.probe)"

    def __init__(self, setup: BenchSetup) -> None:
        self.setup = setup

    def check(self) -> None:
        """Refuse before anything starts: a target it cannot serve, a missing module."""
        if self.setup.target not in self.targets:
            message = (
                f"backend {self.name!r} cannot serve a {self.setup.target} pool (it serves: "
                f"{', '.join(sorted(self.targets))}); choose another --target or --backend"
            )
            raise BenchError(message)
        for module, install in self.needs.items():
            if find_spec(module) is None:
                message = f"backend {self.name!r} needs {module}, which is not installed: {install}"
                raise BenchError(message)

    def planned(self) -> dict[str, Any]:
        """The overrides :meth:`start` will give, as far as known before anything starts
        (to validate every profile with them)."""
        return {}

    @contextmanager
    def start(self, label: str, profile: str, geometry: PoolGeometry) -> Iterator[dict[str, Any]]:
        """One instance for side ``label`` holding the pages of ``geometry``: the overrides
        that point a pipeline at it."""
        yield {"placement.capacity_bytes": geometry.nbytes}

    def limit_gbps(self, pipeline: Pipeline, nbytes: int) -> float:
        """GB/s of the backend's largest single move of ``nbytes`` into the pool."""
        start = time.perf_counter()
        pipeline.probe(nbytes)
        return nbytes / (time.perf_counter() - start) / 1e9

    def describe(self, transport: Mapping[str, Any]) -> dict[str, Any]:
        """Keys this backend adds to the result (``transport`` is P's ``stats().transport``)."""
        return {}


class DramBackend(BenchBackend):
    """The process-owned DRAM tier: nothing to start; each pipeline opens its own tier."""

    name = "dram"
    targets = frozenset({"cpu", "cuda"})
    limit_text = "one contiguous copy of the same bytes, tier -> pool, same transport"


class PeerBackend(BenchBackend):
    """A ``kvcr-policy serve`` process per side on loopback, reached over UCX."""

    name = "peer"
    needs: ClassVar[Mapping[str, str]] = {"ucxx": "pip install 'kvcr-policy[ucx]'"}
    limit_text = "one UCX message of the same bytes, peer tier -> pool, same two processes"

    def __init__(self, setup: BenchSetup) -> None:
        super().__init__(setup)
        self.servers: dict[str, dict[str, Any]] = {}

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


MOONCAKE_INSTALL = (
    "bash .ci/install-mooncake.sh and pip install -e plugins/kvcr-policy-mooncake (from the "
    "kvcr_policy source tree)"
)


class MooncakeBackend(BenchBackend):
    """Mooncake Store: per side a ``mooncake_master`` on free loopback ports and one segment
    process that holds the pages; the pipelines contribute no segment, so every restore reads
    another process's segment over tcp. The limit is one ``batch_get_into`` of the same bytes,
    as page-sized objects in the same segment, into contiguous pool memory
    (``Pipeline.probe``), after an untimed first probe stored them."""

    name = "mooncake"
    # mooncake.store itself is checked by importing it (find_spec would import its package).
    needs: ClassVar[Mapping[str, str]] = {"kvcr_policy_mooncake": MOONCAKE_INSTALL}
    limit_text = (
        "one batch_get_into of the same bytes (page-sized objects) from the same segment into "
        "contiguous pool memory (Pipeline.probe)"
    )
    #: The segment's size in copies of the run's pages: it holds P's pages, the peer's (with
    #: --peer) and the probe's, and the master starts evicting at 90 % full.
    copies = 4

    def __init__(self, setup: BenchSetup) -> None:
        super().__init__(setup)
        self.instances: dict[str, dict[str, Any]] = {}
        self._probed: set[tuple[int, int]] = set()

    def check(self) -> None:
        super().check()
        try:
            import mooncake.store  # noqa: F401  (libibverbs.so.1 is found only on import)
        except ImportError as err:
            raise BenchError(f"backend 'mooncake' cannot import mooncake ({err}): "
                             f"{MOONCAKE_INSTALL}") from err  # fmt: skip

    def planned(self) -> dict[str, Any]:
        return {"backend.name": "mooncake", "backend.options.master": "127.0.0.1:1"}

    @contextmanager
    def start(self, label: str, profile: str, geometry: PoolGeometry) -> Iterator[dict[str, Any]]:
        from kvcr_policy_mooncake.master import MasterProcess
        from kvcr_policy_mooncake.segment import SegmentProcess

        with MasterProcess() as master:
            size = max(64 << 20, self.copies * geometry.nbytes + (64 << 20))
            holder = SegmentProcess(master.address, size)
            try:
                yield {
                    "backend.name": "mooncake",
                    "backend.options.master": master.address,
                    "backend.options.segment_bytes": 0,
                }
            finally:
                self.instances[label] = {
                    "master": master.address,
                    "segment": holder.segment,
                    "segment_bytes": size,
                    "segment_exit_code": holder.stop(),
                }

    def limit_gbps(self, pipeline: Pipeline, nbytes: int) -> float:
        key = (id(pipeline), nbytes)
        if key not in self._probed:  # the first probe stores the object it reads
            pipeline.probe(nbytes)
            self._probed.add(key)
        return super().limit_gbps(pipeline, nbytes)

    def describe(self, transport: Mapping[str, Any]) -> dict[str, Any]:
        return {"mooncake": dict(self.instances), "threads": transport.get("threads")}


class KvcrBackend(BenchBackend):
    """The KVCR runner (plugin ``kvcr-policy-kvcr``) in this process, one per side and pool:
    its local DRAM is a region the side's placement opens, as in a deployment."""

    name = "kvcr"
    needs: ClassVar[Mapping[str, str]] = {
        "kvcr_policy_kvcr": "pip install -e plugins/kvcr-policy-kvcr (it pulls kvcr==0.1.1)",
        "kvcr": "pip install kvcr==0.1.1",
    }
    limit_text = (
        "one NIXL transfer of the same bytes, KVCR's DRAM region -> pool, by an agent built "
        "like KVCR's"
    )

    def __init__(self, setup: BenchSetup) -> None:
        super().__init__(setup)
        self._warm: weakref.WeakSet[Pipeline] = weakref.WeakSet()

    def planned(self) -> dict[str, Any]:
        return {"backend.name": self.name}

    @contextmanager
    def start(self, label: str, profile: str, geometry: PoolGeometry) -> Iterator[dict[str, Any]]:
        yield {"backend.name": self.name, "placement.capacity_bytes": geometry.nbytes}

    def limit_gbps(self, pipeline: Pipeline, nbytes: int) -> float:
        # The first probe builds the probe agent and registers both buffers: not a transfer.
        if pipeline not in self._warm:
            pipeline.probe(nbytes)
            self._warm.add(pipeline)
        return super().limit_gbps(pipeline, nbytes)


BACKENDS: dict[str, type[BenchBackend]] = {
    "dram": DramBackend,
    "peer": PeerBackend,
    "kvcr": KvcrBackend,
    "mooncake": MooncakeBackend,
}


def default_backend(loaded: LoadedConfig) -> str:
    """The backend a profile implies: the one it names, when the benchmark knows it; else
    ``peer`` when its transport is ``ucx``, else ``dram``."""
    named = loaded.config.backend.name
    if named in BACKENDS:
        return named
    return "peer" if loaded.config.transport.name == "ucx" else "dram"
