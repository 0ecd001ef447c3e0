"""The ``kvcr`` backend of ``kvcr-policy bench`` (registered by this plugin's hook)."""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from kvcr_policy.plugin_api import BenchBackend, BenchSetup, Pipeline, PoolGeometry

__all__ = ["KvcrBench"]


class KvcrBench(BenchBackend):
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
    limit_short = "one NIXL transfer"

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
