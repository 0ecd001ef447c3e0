"""What a tier backend adds to be benchmarked: a :class:`BenchBackend`, registered by a hook.

A :class:`BenchBackend` is the small piece a tier backend adds to ``kvcr-policy bench``: the
targets it supports, the optional modules it needs (checked before anything starts), how to
start one instance of it for one side (a server process, a daemon; nothing for the in-process
DRAM tier) and which overrides point a pipeline at that instance, and its limit: by default
the time of :meth:`Pipeline.probe <kvcr_policy.pipeline.Pipeline.probe>`, the backend's
largest single move of the same bytes from its tier into the pool.

The built-in ``dram`` and ``peer`` adapters live in :mod:`kvcr_policy.bench.backends`; a
plugin registers its own with the ``kvcr_register_bench_backends`` hook
(:mod:`kvcr_policy.hookspecs`), under the name ``--backend`` selects. This module is part of
the plugin API: it imports nothing of ``bench`` at run time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any, ClassVar, Protocol

from .errors import BenchError, UnsupportedError
from .geometry import PoolGeometry

__all__ = ["BenchBackend", "BenchSetup", "Pipeline"]


class Pipeline(Protocol):
    """What an adapter uses of a side's :class:`~kvcr_policy.pipeline.Pipeline`."""

    def probe(self, nbytes: int, pool: str | None = None) -> None: ...

    def probe_store(self, nbytes: int, pool: str | None = None) -> None: ...


@dataclass(frozen=True, slots=True)
class BenchSetup:
    """One run's axes and sizes; :func:`~kvcr_policy.bench.resolve.resolve` checks them all.

    The axes: ``target`` (where the pool lives: ``cpu`` or ``cuda``), ``backend`` (where the
    tier lives: ``dram``, ``peer``, ...; None takes the profile's), and the comparison: P
    (``profile``) against profile Q (``vs``), or against a peer implementation (``peer``, e.g.
    ``hicache-file``) when one is named. The first nine fields keep their historical order.
    """

    profile: str = "throughput"
    vs: str = "default"
    geometry: str = "qwen3-32b"
    layout: str = "layer_first"
    tokens: int = 8192
    repeat: int = 5
    mla: bool = False
    #: Store the keys in a random order, so restores read scattered tier slots.
    scatter: bool = False
    #: ``--set`` values, applied to every pipeline (and peer server) of the run, last.
    overrides: Mapping[str, Any] | None = None
    target: str = "cpu"
    backend: str | None = None
    peer: str | None = None
    #: The peer backend's UCX transports (``transport.options.tls``).
    tls: str = "auto"
    #: Keys of the metadata figure (``exists`` over that many stored keys).
    exists_keys: int = 100_000
    #: Where a file-backed peer implementation writes (default: /dev/shm when it exists).
    folder: str | None = None
    #: ``--vs-set`` values, applied to Q's pipelines only, after ``overrides``.
    vs_overrides: Mapping[str, Any] | None = None
    #: Metrics are served (``--metrics``): the placement is audited after the stores, so the
    #: placement gauges show where the stored pages are.
    metrics: bool = False
    #: Tensor-parallel ranks: one process per rank (each on its own GPU on ``cuda``), each
    #: with its shard of the pool, all restoring at once (:mod:`.ranks`); 1 runs in-process.
    ranks: int = 1
    #: ``--devices``: the GPU of each rank on ``cuda`` (several ranks may share one); None
    #: runs rank ``r`` on GPU ``r``.
    devices: tuple[int, ...] | None = None
    #: The model's page shape (``layers``, ``heads``, ``head_dim``, ``dtype``, ``page_size``;
    #: ``mla`` is :attr:`mla`), ``geometry`` then being the model's name; None: the preset
    #: ``geometry`` names (:mod:`kvcr_policy.model.shape`).
    dims: Mapping[str, Any] | None = None
    #: ``--tp``: the tensor-parallel size whose rank's shard one restore moves (None: ``ranks``).
    tp: int | None = None


class BenchBackend:
    """How one tier backend is started and measured; one object per benchmark run."""

    name: ClassVar[str]
    #: Targets whose pools this backend can serve.
    targets: ClassVar[frozenset[str]] = frozenset({"cpu"})
    #: Optional modules it needs -> how to install them.
    needs: ClassVar[Mapping[str, str]] = {}
    #: What the limit is, in words (the JSON's ``limit``); an adapter whose limit depends on the
    #: setup sets it on the instance.
    limit_text: str = "one move of the same bytes, tier -> pool (Pipeline.probe)"
    #: A store's limit, in words (the JSON's ``store_limit``), where the backend has one.
    store_limit_text: str = (
        "one move of the same bytes, pool -> emptied tier (Pipeline.probe_store)"
    )
    #: The same in a few words, for the verdict line (the JSON's ``limit_short``). The bench
    #: measures this host's memory copy of the same bytes beside it, for every backend.
    limit_short: str = "one move of the same bytes"

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

    def store_limit_gbps(self, pipeline: Pipeline, nbytes: int) -> float | None:
        """GB/s of the backend's largest single move of ``nbytes`` out of the pool into its
        emptied tier (:meth:`Pipeline.probe_store <kvcr_policy.pipeline.Pipeline.probe_store>`),
        a store's limit; None where the backend has no such move."""
        start = time.perf_counter()
        try:
            pipeline.probe_store(nbytes)
        except UnsupportedError:
            return None
        return nbytes / (time.perf_counter() - start) / 1e9

    def describe(self, transport: Mapping[str, Any]) -> dict[str, Any]:
        """Keys this backend adds to the result (``transport`` is P's ``stats().transport``)."""
        return {}
