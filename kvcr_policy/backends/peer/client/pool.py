"""PeerPool: a pool whose tier lives on a peer; the :class:`~...base.PoolTier` of ``peer``.

The mover drives it like any backend: one EXISTS round trip per metadata-query batch, and per
batch one claimed read (CLAIM, SEND; on a shared-memory connection CLAIM, a copy, COPIED: see
:mod:`.copies`) or reserved write (RESERVE, POST, COMMIT; RESERVE, a copy, COMMIT) on the peer,
its descriptors shaped by the mover's coalescing strategy within what both the pipeline and
the peer accept (negotiated on each connect). A peer that went away turns into misses (logged
and counted), never into an exception on the data path; a full tier raises CapacityError, as
the local store does.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import Any

import numpy as np

from kvcr_policy.config.schema import PolicyConfig
from kvcr_policy.descriptors import Descriptors
from kvcr_policy.errors import (
    BackendUnavailableError,
    ClosedError,
    IndicesError,
    TransportError,
    UnsupportedError,
)
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.observability.repeats import Repeats

from ...base import Endpoint, Shape
from ..requests import memory_view, message_limit
from ..wire import messages as m
from ..wire.payload import MAX_DESCRIPTORS, MAX_KEYS
from . import copies, ops, steps
from .client import PeerClient
from .target import Target

__all__ = ["PeerPool"]

log = logging.getLogger("kvcr_policy.backends.peer.client.pool")
_repeats = Repeats(log)  # a peer that is down fails every call: one line per interval

#: Most keys of a set's other batches its first RESERVE asks the server to keep (see
#: _Transfer._keep): a set of up to this many pages beyond its batch never evicts its own
#: present keys (the server also keeps each batch's keys for the call's later batches).
KEEP_KEYS = 16384
KEEP_BYTES = 2 << 20
#: Numbers of this process's set calls (RESERVE ``call``; 0 is no call).
_CALLS = itertools.count(1)
#: How long past ``op_timeout_s`` a batch waits for the peer's answer before it fails: the
#: server gives a claim up at its own ``op_timeout_s`` and says so, and its sends stop before
#: this side gives the pages to the fallback (which may read them again).
ANSWER_GRACE_S = 1.0


def _cap(batches: list[tuple[int, int]], most: int = MAX_KEYS) -> list[tuple[int, int]]:
    """Batches cut to at most ``most`` entries (one request names at most MAX_KEYS)."""
    out: list[tuple[int, int]] = []
    for start, stop in batches:
        out.extend((a, min(a + most, stop)) for a in range(start, stop, most))
    return out


class PeerPool:
    """See the module docstring; made by :meth:`~..backend.PeerBackend.attach`."""

    def __init__(
        self,
        client: PeerClient,
        name: str,
        geometry: PoolGeometry,
        endpoint: Endpoint,
        strategies: Mapping[str, Any],
        config: PolicyConfig,
    ) -> None:
        self.client = client
        self.name = name
        self.geometry = geometry
        self._buffer = endpoint.buffer  # keeps the pool memory alive while views exist
        self.align = endpoint.address % m.ALIGN_BYTES
        self.view = memory_view(endpoint.address, endpoint.nbytes)
        self.coalescing = strategies["coalescing"]
        # What the pipeline lets the strategy use; narrowed to what the peer accepts on connect.
        self.allowed = frozenset(strategies.get("allowed", self.coalescing.needs))
        self.usable = self.allowed
        # Plain descriptors of one batch must fit one SEND or POST.
        self.batch_pages = max(1, min(MAX_KEYS, MAX_DESCRIPTORS // geometry.fragments_per_page))
        self.on_unsupported = config.coalescing.on_unsupported
        self.timeout = config.transport.op_timeout_s
        self.counters: Counter[str] = Counter()
        self._warned = False
        self._closed = False
        self.client.register(self)

    # ---- what the client asks of a pool ---------------------------------------------------

    def _negotiate(self, capabilities: frozenset[str]) -> None:
        missing = sorted(self.allowed - capabilities)
        if missing:
            message = (
                f"pool {self.name!r}: peer {self.client.address} cannot {' or '.join(missing)} "
                "descriptors, which the coalescing configuration asks for"
            )
            if self.on_unsupported == "error":
                raise UnsupportedError(message + "; set coalescing.on_unsupported = 'fallback'")
            if not self._warned:
                log.warning("%s; sending plain descriptors (coalescing.on_unsupported)", message)
                self._warned = True
        self.usable = self.allowed & capabilities

    def attach_message(self, capabilities: frozenset[str]) -> m.Attach:
        self._negotiate(capabilities)
        g = self.geometry
        return m.Attach(
            g.name,
            g.layout,
            g.layers,
            g.heads,
            g.head_dim,
            g.dtype,
            g.page_size,
            g.tokens,
            g.mla,
            self.align,
        )

    def target(
        self,
        number: int,
        slots: int,
        capabilities: frozenset[str],
        tier_view: np.ndarray | None = None,
    ) -> Target:
        self._negotiate(capabilities)
        return Target.make(number, self.geometry, slots, self.view, tier_view)

    # ---- RemotePool -----------------------------------------------------------------------

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise ClosedError(f"peer pool {self.name!r} is closed: {call}() refused")

    def _miss(self, call: str, err: Exception) -> None:
        self.counters[f"{call}_errors"] += 1
        kind = f"{self.client.address} {self.name} {call} {type(err).__name__}"
        address = self.client.address
        _repeats.warning(kind, "pool %r: %s on peer %s failed: %s", self.name, call, address, err)

    def contains(self, keys: Sequence[str]) -> int:
        """Leading keys present on the peer: one EXISTS round trip per MAX_KEYS keys; a peer
        that cannot be reached is a miss (logged and counted)."""
        self._check_open("exists")
        keys = list(keys)
        for start in range(0, len(keys), MAX_KEYS):
            chunk = keys[start : start + MAX_KEYS]
            try:
                reply = self.client.request(self, partial(m.Exists, keys=chunk), self.timeout)
            except TransportError as err:
                self._miss("exists", err)
                return start
            self.counters["query_batches"] += 1
            if reply.count < len(chunk):
                return start + min(int(reply.count), len(chunk))
        return len(keys)

    def read(self, keys: list[str], pages: np.ndarray) -> _Read:
        self._check_open("get")
        return _Read(self, keys, pages)

    def write(self, keys: list[str], pages: np.ndarray) -> _Write:
        self._check_open("set")
        return _Write(self, keys, pages)

    def delete(self, keys: Sequence[str]) -> int:
        self._check_open("delete")
        keys = list(keys)
        total = 0
        for start, stop in _cap([(0, len(keys))]):
            chunk = keys[start:stop]
            reply = self.client.request(self, partial(m.Delete, keys=chunk), self.timeout)
            total += int(reply.count)
        return total

    def clear(self) -> None:
        self._check_open("clear")
        self.client.request(self, m.Clear, self.timeout)

    def probe(self, nbytes: int) -> None:
        """One UCX message of ``nbytes`` from the peer's tier into this pool (benchmarks)."""
        self._check_open("probe")
        if not 0 < nbytes <= len(self.view):  # 0 bytes would never complete (red team S11)
            message = f"pool {self.name!r}: probe of {nbytes} bytes; expected 1..{len(self.view)}"
            raise IndicesError(message)
        limit = message_limit(self.timeout, nbytes)
        if not self.client.run(self, _probe, nbytes, timeout=limit + ANSWER_GRACE_S):
            raise TransportError(f"pool {self.name!r}: the probe of {nbytes} bytes failed")

    def stats(self) -> dict[str, Any]:
        data: dict[str, Any] = {**self.client.describe(), "counters": dict(self.counters)}
        if not self._closed:
            try:
                reply = self.client.request(self, m.Stats, self.timeout)
                data["remote"] = json.loads(reply.text)
            except (TransportError, ValueError) as err:
                data["remote_error"] = str(err)
        return {"peer": data}

    def audit(self) -> dict[str, Any] | None:
        return None  # the peer's placement is audited where it runs (`kvcr-policy serve`)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.client.unregister(self)
        self.view = np.zeros(0, dtype=np.uint8)
        self._buffer = None


class _Transfer:
    """One get or set on a peer pool: every batch is claimed or reserved on the peer itself,
    so nothing is held between batches and :meth:`abort` has nothing to undo."""

    #: What runs one batch on the connection (a read's or a write's).
    op: Callable[..., None]

    def __init__(self, pool: PeerPool, keys: list[str], pages: np.ndarray) -> None:
        self.pool = pool
        self.keys = keys
        self.pages = pages
        self.limit = len(keys)

    def submit(self, positions: np.ndarray, shape: Shape) -> Future[np.ndarray]:
        pool = self.pool
        start, stop = int(positions[0]), int(positions[-1]) + 1  # the mover sends runs
        most = pool.batch_pages  # one request's plain descriptors must fit one frame
        chunks = [(a, min(a + most, stop)) for a in range(start, stop, most)]
        combined = _Deadline(pool.timeout + ANSWER_GRACE_S, pool.client.progress)
        results: list[Any] = [None] * len(chunks)
        left = [len(chunks)]

        def within(plain: Descriptors) -> Descriptors:
            return shape(plain, pool.usable)  # what this peer accepts, known since connect

        def settle(i: int, future: Future[Any]) -> None:
            results[i] = future.result()
            left[0] -= 1
            if left[0]:
                return
            errors = [r for r in results if isinstance(r, BaseException)]
            if errors:
                combined.set_exception(errors[0])
            else:
                combined.set_result(np.concatenate(results))

        for i, (a, b) in enumerate(chunks):
            future = pool.client.start(
                pool, type(self).op, self.keys[a:b], self.pages[a:b], within, *self._keep(a, b)
            )
            future.add_done_callback(partial(settle, i))
        return combined

    def _keep(self, start: int, stop: int) -> tuple[steps.Keep, ...]:
        return ()

    def finish(self, moved: np.ndarray) -> list[bool]:
        return [bool(x) for x in moved]

    def abort(self) -> None:
        """Nothing to undo: each batch released its claim or reservation on the peer."""


class _Read(_Transfer):
    """A get: each batch claims its pages on the peer (CLAIM, SEND)."""

    miss = "absent"

    @staticmethod
    def op(conn: Any, target: Target, keys: Any, pages: Any, shape: Any, done: Any) -> None:
        b = steps.Batch(conn, target, keys, pages, shape, done)
        steps.claim(b, (copies.copy_in if target.shared else ops.receive)(b))


class _Write(_Transfer):
    """A set: each batch reserves its slots on the peer (RESERVE, POST, COMMIT)."""

    needs: np.ndarray | None = None
    miss = "claimed"

    def __init__(self, pool: PeerPool, keys: list[str], pages: np.ndarray) -> None:
        super().__init__(pool, keys, pages)
        self.call = next(_CALLS)
        self._kept = False  # the call's keys went with a RESERVE already

    @staticmethod
    def op(
        conn: Any, target: Target, keys: Any, pages: Any, shape: Any, keep: Any, done: Any
    ) -> None:
        b = steps.Batch(conn, target, keys, pages, shape, done)
        steps.reserve(b, keep, (copies.copy_out if target.shared else ops.send)(b))

    def _keep(self, start: int, stop: int) -> tuple[steps.Keep, ...]:
        """The call's number, and with its first batch the keys outside ``[start, stop)``
        (those after it first), which no batch of the call may evict: a set never evicts its
        own present keys. At most :data:`KEEP_KEYS` of them, sent once per call (one RESERVE
        frame stays small, and a set of many batches costs no more on the wire than its
        keys)."""
        if self._kept:
            return ((self.call, ()),)
        self._kept = True
        kept: list[str] = []
        size = 0
        for key in itertools.chain(self.keys[stop:], reversed(self.keys[:start])):
            size += len(key) + 4
            if len(kept) == KEEP_KEYS or size > KEEP_BYTES:
                break
            kept.append(key)
        return ((self.call, kept),)


def _probe(conn: Any, target: Target, *args: Any) -> None:
    (copies.probe if target.shared else ops.probe)(conn, target, *args)


class _Deadline(Future):
    """A future whose ``result()`` fails once the peer showed no sign of life (no frame, no UCX
    message completed: ``progress()`` unchanged) for ``seconds``: a peer that never answers
    fails the batch instead of hanging the caller, one that is slow only makes it slower."""

    def __init__(self, seconds: float, progress: Callable[[], int]) -> None:
        super().__init__()
        self._seconds = seconds
        self._progress = progress

    def result(self, timeout: float | None = None) -> Any:
        if timeout is not None:
            return super().result(timeout)
        last = self._progress()
        while True:
            try:
                return super().result(self._seconds)
            except FutureTimeout:
                now = self._progress()
                if now == last:
                    message = f"the peer showed no progress for {self._seconds:.1f} s"
                    raise BackendUnavailableError(message) from None
                last = now
