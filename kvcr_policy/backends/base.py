"""The tier-backend seam: what any place that holds pages does for the pipeline.

A backend is built once per pipeline by the factory a plugin registered under its name
(``kvcr_register_backends``), from the frozen config, its own options model and a
:class:`BackendContext`. The pipeline attaches each registered pool and then only calls the
objects below; the :class:`~kvcr_policy.mover.Mover` drives every transfer (batches, delivery
windows, descriptor shaping through the coalescing strategy, fallback), so a backend moves one
batch at a time and never loops over a call's pages itself::

    TierBackend                         one per pipeline
      .capabilities, .devices           descriptor shapes it accepts; memory a pool may live in
      .attach(PoolSpec) -> PoolTier     one registered pool
      .close()                          after every pool tier closed; idempotent

    PoolTier                            one pool on one backend
      .contains(keys) -> int            leading keys present (one metadata-query batch)
      .read(keys, pages)                -> ReadTransfer for one get call
      .write(keys, pages)               -> WriteTransfer for one set call
      .delete(keys) -> int, .clear()
      .close()                          waits for in-flight work; frees nothing a transfer may
                                        still touch; calls after it raise ClosedError

    Reporting, optional (:class:`~.reporting.BackendReporting`,
    :class:`~.reporting.PoolReporting`; asked for through :mod:`kvcr_policy.backends.reporting`,
    so a backend without them still moves pages)
      TierBackend.describe() -> dict    stats().transport
      PoolTier.probe(nbytes)            the backend's largest single move, tier -> pool (limits)
      PoolTier.stats() -> dict          the pool's figures in stats()
      PoolTier.audit() -> dict | None   where its memory landed (backends that place memory)
      PoolTier.usage() -> TierUsage     capacity, bytes used, evictions (metrics)

    Reading early, optional (:class:`PoolReadsEarly`, a runtime-checkable protocol: the
    pipeline checks each pool tier for it once, when the pool registers)
      PoolTier.read_early(keys)         -> EarlyRead | None: a read's first copies, started
                                        before the call is validated and claimed (the keys
                                        too: a list as the caller gave it, where a key that
                                        is no str is found in no tier)
      EarlyRead.read(keys, pages)       in place of PoolTier.read for that call: keeps the
                                        copies only where its claim finds the same bytes
      EarlyRead.cancel()                nothing of it is used after (idempotent); the pipeline
                                        calls it once the call ends, however it ends

    Publishing early, optional (:class:`PublishesEarly`, a runtime-checkable protocol: the
    mover checks each write transfer for it once per call)
      WriteTransfer.publish(positions)  the pages at ``positions`` arrived (a batch that
                                        succeeded, told in order): their keys may be published
                                        now, while later batches copy; ``finish`` does the rest
      WriteTransfer.ends                optional too: pages the mover cuts off the call's first
                                        and last batches as batches of their own (None: none),
                                        so copies start once that much is prepared and only
                                        that much is left to publish after the last copy

    ReadTransfer                        the keys of one get call, in order
      .limit                            keys it claimed from the start: the present run
      .miss                             why keys past ``limit`` miss, a metrics reason
                                        ("absent", or "evicted" where the backend knows)
    WriteTransfer                       the keys of one set call, in order
      .limit                            keys it covers from the start (reserved)
      .needs                            bool mask over those keys: pages to move (None: all)
      .miss                             why keys past ``limit`` are not stored ("claimed": held
                                        by transfers in flight)
    both
      .submit(positions, shape)         -> Future of per-position success (bool array)
      .finish(moved) -> list[bool]      release / publish; the call's result per key
      .abort()                          undo after an exception; never while a batch runs

**A backend never sees a key twice in one call.** The pipeline splits a call with repeated
keys into rounds (:func:`kvcr_policy.keys.rounds`) before any backend sees it, so the keys of
one ``read`` or ``write`` are distinct and a backend needs no handling of repeats.

**A failed batch is the fallback's.** A backend retries nothing itself: the mover hands the
pages of a batch that raised to the fallback strategy, which submits them again one at a time,
``submit([position], shape)`` with a ``shape`` that keeps the plain descriptors.

``shape(plain, within=None)`` is the mover's: it takes the plain descriptors of a batch (``src``
and ``dst`` relative to each side's buffer, one per fragment, built with
:func:`~kvcr_policy.descriptors.build_descriptors`) and returns what to move, merged and cut
by the configured coalescing strategy within the backend's capabilities (narrowed further by
``within``). A backend that moves
bytes by descriptors calls it once per batch; one that does not (an engine with its own data
path) declares no capabilities and may ignore it.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from ..config.loading import LoadedConfig
    from ..config.schema import PolicyConfig
    from ..descriptors import Descriptors
    from ..geometry import PoolGeometry
    from ..strategies import CoalescingStrategy, EvictionStrategy, PlacementStrategy

__all__ = [
    "BackendContext",
    "ConfiguredTransport",
    "EarlyRead",
    "Endpoint",
    "PoolReadsEarly",
    "PoolSpec",
    "PoolTier",
    "PublishesEarly",
    "ReadTransfer",
    "Shape",
    "TierBackend",
    "Transfer",
    "WriteTransfer",
    "check_device",
]


class Shape(Protocol):
    """The mover's descriptor shaping for one batch: plain descriptors in, descriptors to move
    out. ``within`` narrows what the strategy may use to what this backend accepts right now
    (a peer's capabilities are known only once connected); None: the backend's declared ones."""

    def __call__(self, plain: Descriptors, within: frozenset[str] | None = None) -> Descriptors: ...


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One side of a copy: a buffer's base address, its size, its device, and the buffer."""

    address: int
    nbytes: int
    device: str = "cpu"
    buffer: Any = None


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A validated pool: its name, its geometry and its memory."""

    name: str
    geometry: PoolGeometry
    endpoint: Endpoint


class ConfiguredTransport(Protocol):
    """The configured transport (``transport.name``) as a backend receives it, already built.

    A backend checks for the kind it works with (``dram``: a copy engine; ``peer``: ``ucx``)
    and refuses another with a :class:`~kvcr_policy.errors.ConfigError`.
    """

    name: str
    capabilities: frozenset[str]
    devices: frozenset[str]

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class BackendContext:
    """What a backend factory gets besides its options: the load and resolved objects.

    ``transport`` is the configured transport object (``transport.name``), already built;
    ``placement`` the configured placement strategy, for backends that place memory;
    ``coalescing`` the configured coalescing strategy, for backends that negotiate what of it
    they accept (the mover applies it; a backend never calls it on its own); ``eviction`` the
    configured eviction strategy, for backends that keep their own slot stores (None: the
    placement's stores keep their default policy).
    """

    loaded: LoadedConfig
    placement: PlacementStrategy
    transport: ConfiguredTransport
    coalescing: CoalescingStrategy
    eviction: EvictionStrategy | None = None

    @property
    def config(self) -> PolicyConfig:
        return self.loaded.config


def check_device(spec: PoolSpec, devices: frozenset[str], mover: str) -> None:
    """Refuse a pool whose memory ``mover`` (e.g. "transport 'cpu'") cannot move."""
    device = spec.endpoint.device
    if device.split(":")[0] not in devices:
        from ..errors import PoolError

        message = (
            f"pool {spec.name!r} lives on {device}, but {mover} moves only "
            f"{', '.join(sorted(devices))} memory; choose transport.name = 'cuda' for GPU pools"
        )
        raise PoolError(message)


class ReadTransfer(Protocol):
    """The keys of one get call on one pool: its claimed leading run; see the module
    docstring."""

    limit: int
    miss: str

    def submit(self, positions: np.ndarray, shape: Shape) -> Future[np.ndarray]: ...

    def finish(self, moved: np.ndarray) -> list[bool]: ...

    def abort(self) -> None: ...


class WriteTransfer(Protocol):
    """The keys of one set call on one pool: what it reserved; see the module docstring."""

    limit: int
    needs: np.ndarray | None
    miss: str

    def submit(self, positions: np.ndarray, shape: Shape) -> Future[np.ndarray]: ...

    def finish(self, moved: np.ndarray) -> list[bool]: ...

    def abort(self) -> None: ...


#: Either kind, where only what both have is used (the mover's loop).
Transfer = ReadTransfer | WriteTransfer


class PoolTier(Protocol):
    """One registered pool on one backend; see the module docstring."""

    def contains(self, keys: Sequence[str]) -> int: ...

    def read(self, keys: list[str], pages: np.ndarray) -> ReadTransfer: ...

    def write(self, keys: list[str], pages: np.ndarray) -> WriteTransfer: ...

    def delete(self, keys: Sequence[str]) -> int: ...

    def clear(self) -> None: ...

    def close(self) -> None: ...


class EarlyRead(Protocol):
    """A read's first copies, started early (:class:`PoolReadsEarly`)."""

    def read(self, keys: list[str], pages: np.ndarray) -> ReadTransfer: ...

    def cancel(self) -> None: ...


@runtime_checkable
class PoolReadsEarly(Protocol):
    """A pool tier that starts a read's first copies before the call is validated (optional;
    see the module docstring)."""

    def read_early(self, keys: list[str]) -> EarlyRead | None: ...


@runtime_checkable
class PublishesEarly(Protocol):
    """A write transfer that publishes each batch's keys once its pages arrived, before
    ``finish`` (optional; see the module docstring)."""

    def publish(self, positions: np.ndarray) -> None: ...


class TierBackend(Protocol):
    """A place that holds pages; see the module docstring."""

    name: str
    #: Descriptor shapes the backend accepts: a subset of {"coalesce", "split"}.
    capabilities: frozenset[str]
    #: Devices a pool's memory may live on ("cpu", "cuda").
    devices: frozenset[str]

    def attach(self, pool: PoolSpec) -> PoolTier: ...

    def close(self) -> None: ...
