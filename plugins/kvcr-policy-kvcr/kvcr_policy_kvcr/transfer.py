"""KvcrRead and KvcrWrite: one get or set on a KVCR pool; the transfers of ``kvcr``.

Each batch of a call is one ``deliver`` (a read) or ``deposit`` (a write) of exactly that
batch's pages, so ``batching`` sets the size of every KVCR call and the delivery window bounds
how many are in flight.

Source claims use KVCR's own: a read finds its leading present run (``query``), then
``fetch``es it (in metadata-query-sized calls), which claims every block and hands back a release
handle per block; no claimed block can be evicted or replaced until the call ``release``s the
handles. Blocks KVCR keeps in G3 files must be copied into DRAM to be claimed, so from the first
of them on, each batch claims its own blocks right before its ``deliver`` and releases them when
it completes (DRAM then holds a delivery window of them, not the whole run). KVCR also claims
each block for the duration of its own copy. A batch in which any page failed fails as a whole,
so the fallback strategy submits its pages again one by one and only pages that arrived count.

A staged pool (:mod:`.staging`) moves each batch on its own thread, in parts of at most its
staging slots: a store gathers the part's pages into slots and deposits one element per page; a
restore delivers one element per page into slots, releases the part's late claims and scatters
the pages that arrived into the pool, then gives the slots back.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future
from typing import Any, ClassVar, Protocol

import numpy as np
from kvcr.types import CacheTier, QueryStatus

from kvcr_policy.plugin_api import (
    PoolGeometry,
    Shape,
    TransportError,
    build_descriptors,
)

from . import staged
from .keys import KeySpace
from .layout import PageLayout
from .runner import Entries, Runner
from .staging import Staging

__all__ = ["LOCAL", "PRESENT", "KvcrRead", "KvcrTransfer", "KvcrWrite"]

#: What ``contains`` counts as present: in KVCR's local DRAM, or in its G3 files.
LOCAL = (QueryStatus.HIT, CacheTier.LOCAL_G2)
PRESENT = frozenset({LOCAL, (QueryStatus.FETCHABLE, CacheTier.G3)})


class Pool(Protocol):
    """What a transfer uses of its :class:`~.pool.KvcrPool` (no import of it: no cycle)."""

    name: str
    geometry: PoolGeometry
    layout: PageLayout
    runner: Runner
    keys: KeySpace
    staging: Staging | None
    stager: Executor | None
    _query_batch: int


def _ok(entries: Entries, block: bytes) -> bool:
    entry = entries.get(block)
    return entry is not None and entry.success


def _status(entries: Entries, block: bytes) -> str:
    entry = entries.get(block)
    return "no result" if entry is None else str(entry.status.value)


class KvcrTransfer:
    """One get or set on one KVCR pool (:class:`KvcrRead`, :class:`KvcrWrite`); see the module
    docstring."""

    #: A get (``deliver`` into the pool) or a set (``deposit`` from it).
    read: ClassVar[bool]

    def __init__(self, pool: Pool, keys: list[str], pages: np.ndarray) -> None:
        self.pool, self.keys, self.pages = pool, keys, pages
        self.blocks = pool.keys.block_keys(keys)
        self.handles: list[Any] = []
        self.local = 0  # a read's leading run claimed up front (in KVCR's DRAM)
        self.limit = len(keys)

    def _claim(self) -> int:
        """The leading present run (its length); KVCR claims for its leading part in DRAM.

        Blocks KVCR holds in G3 must first be copied into DRAM, which needs free DRAM: they
        (and everything after the first of them) are claimed batch by batch instead, so DRAM
        only ever holds the delivery window's worth of them.
        """
        runner, step = self.pool.runner, self.pool._query_batch
        limit, local = 0, None
        for start in range(0, len(self.blocks), step):
            statuses = runner.query(self.blocks[start : start + step])
            for i, status in enumerate(statuses):
                if status not in PRESENT:
                    break
                if local is None and status != LOCAL:
                    local = start + i
            else:
                limit += len(statuses)
                continue
            limit += i
            break
        self.local = limit if local is None else local
        claimed, handles = self._fetch(self.blocks[: self.local])
        self.handles.extend(handles)
        if claimed < self.local:  # evicted since the query: the run ends there
            self.local = limit = claimed
        return limit

    def _fetch(self, blocks: list[bytes]) -> tuple[int, list[Any]]:
        """Claim ``blocks`` with KVCR's fetch (in metadata-query-sized calls, stopping at the
        first that fails): how many lead, and the handles held for them."""
        runner, step, labels = self.pool.runner, self.pool._query_batch, self.pool.layout.labels
        lead = 0
        held: list[Any] = []
        for start in range(0, len(blocks), step):
            part = blocks[start : start + step]
            entries = runner.start("fetch", runner.kvcr.fetch, part, None, labels).result()
            run = next((i for i, b in enumerate(part) if not _ok(entries, b)), len(part))
            kept = set(part[:run])
            claims = {b: e.release_handle for b, e in entries.items() if e.release_handle}
            runner.hold(list(claims.values()))
            # Blocks past the first failure are not read: their claims go back at once.
            runner.release([h for b, h in claims.items() if b not in kept])
            held.extend(h for b, h in claims.items() if b in kept)
            lead += run
            if run < len(part):
                break
        return lead, held

    def claim_late(self, positions: np.ndarray) -> list[Any]:
        """Claims for the batch's pages past the leading DRAM run (raise if any fails)."""
        late = [self.blocks[p] for p in positions.tolist() if p >= self.local]
        if not late:
            return []
        claimed, handles = self._fetch(late)
        if claimed < len(late):
            self.pool.runner.release(handles)
            message = f"pool {self.pool.name!r}: KVCR could not bring a page of the batch into DRAM"
            raise TransportError(message)
        return handles

    def _start(self, positions: np.ndarray, shape: Shape) -> Future[Entries]:
        pool = self.pool
        pages = self.pages[positions]
        plain = build_descriptors(pool.geometry, pages, pool.geometry, pages)
        shaped = shape(plain)
        refs = pool.layout.refs(shaped, shaped.dst if self.read else shaped.src)
        blocks = {self.blocks[p]: r for p, r in zip(positions.tolist(), refs, strict=True)}
        runner = pool.runner
        if self.read:
            return runner.start("deliver", runner.kvcr.deliver, blocks)
        return runner.start("deposit", runner.kvcr.deposit, blocks)

    def ok(self, entries: Entries, position: int) -> bool:
        return _ok(entries, self.blocks[position])

    def submit(self, positions: np.ndarray, shape: Shape) -> Future[np.ndarray]:
        if self.pool.stager is not None:  # staged: one element per page, no descriptors
            return self.pool.stager.submit(staged.move, self, positions)
        late = self.claim_late(positions) if self.read else []
        try:
            started = self._start(positions, shape)  # the blocks are distinct: one call
        except BaseException:
            self.pool.runner.release(late)
            raise
        done: Future[np.ndarray] = Future()

        def settle(future: Future[Entries]) -> None:
            self.pool.runner.release(late)  # delivered or failed: DRAM may take others
            try:
                self.check(positions, future.result())
            except BaseException as err:
                done.set_exception(err)
            else:
                done.set_result(np.ones(len(positions), dtype=bool))

        started.add_done_callback(settle)
        return done

    def check(self, positions: np.ndarray, entries: Entries) -> None:
        """Raise when any page of the batch did not move (the fallback then retries them)."""
        failed = [
            _status(entries, self.blocks[p])
            for p in positions.tolist()
            if not _ok(entries, self.blocks[p])
        ]
        if failed:
            what = "delivered" if self.read else "stored"
            statuses = sorted(set(failed))
            message = (
                f"pool {self.pool.name!r}: KVCR {what} {len(positions) - len(failed)} of "
                f"{len(positions)} pages of a batch (others: {', '.join(statuses)})"
            )
            raise TransportError(message)

    def finish(self, moved: np.ndarray) -> list[bool]:
        result = [False] * len(self.keys)
        if self.read:
            self.pool.runner.release(self.handles)
            self.handles = []
            result[: self.limit] = moved.tolist()
            return result
        return [bool(x) for x in moved]

    def abort(self) -> None:
        self.pool.runner.release(self.handles)
        self.handles = []


class KvcrRead(KvcrTransfer):
    """One get: its leading present run claimed (:meth:`_claim`), released at finish."""

    read = True
    miss = "absent"

    def __init__(self, pool: Pool, keys: list[str], pages: np.ndarray) -> None:
        super().__init__(pool, keys, pages)
        try:
            self.limit = self._claim()
        except BaseException:  # the pipeline never sees this transfer: release here
            pool.runner.release(self.handles)
            raise


class KvcrWrite(KvcrTransfer):
    """One set: every key deposited (the keys are distinct, backends.base: all move)."""

    read = False
    needs: np.ndarray | None = None
    miss = "claimed"
