"""What one benchmark run is asked to do: :class:`BenchSetup`, and :class:`BenchError`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import KVCRPolicyError

__all__ = ["BenchError", "BenchSetup"]


class BenchError(KVCRPolicyError):
    """The benchmark cannot run as asked: an input, memory, or a missing optional dependency."""


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
