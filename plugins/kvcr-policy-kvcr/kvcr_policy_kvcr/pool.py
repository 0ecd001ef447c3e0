"""KvcrPool: one pipeline pool on its own KVCR runner; the ``PoolTier`` of ``kvcr``.

The mover drives it like any backend: ``contains`` is one KVCR ``query`` per metadata-query
batch; each batch of a call is one ``deliver`` (a read) or ``deposit`` (a write) of exactly that
batch's pages, so ``batching`` sets the size of every KVCR call and the delivery window bounds
how many are in flight.

Source claims use KVCR's own: a read first ``fetch``es its keys (in metadata-query-sized calls,
stopping at the first miss), which claims every present block and hands back a release handle
per block; the leading claimed run is what the read may deliver, and no claimed block can be
evicted or replaced until the call ``release``s the handles. KVCR also claims each block for the
duration of its own copy. A batch in which any page failed fails as a whole, so the fallback
strategy retries it page by page and only pages that arrived count.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
from kvcr.types import CacheTier, QueryStatus

from kvcr_policy.backends.base import Endpoint, Shape
from kvcr_policy.backends.dram.tier import Region
from kvcr_policy.descriptors import Descriptors, build_descriptors
from kvcr_policy.errors import ClosedError, IndicesError, TransportError

from .agent import ProbeAgent
from .keys import KeySpace
from .layout import PageLayout
from .policy import TierPolicy
from .runner import Entries, Runner

__all__ = ["KvcrPool"]

log = logging.getLogger("kvcr_policy_kvcr.pool")

#: What ``contains`` counts as present: in KVCR's local DRAM, or in its G3 files.
LOCAL = (QueryStatus.HIT, CacheTier.LOCAL_G2)
PRESENT = frozenset({LOCAL, (QueryStatus.FETCHABLE, CacheTier.G3)})


def _ok(entries: Entries, block: bytes) -> bool:
    entry = entries.get(block)
    return entry is not None and entry.success


def _status(entries: Entries, block: bytes) -> str:
    entry = entries.get(block)
    return "no result" if entry is None else str(entry.status.value)


def _plain(plain: Descriptors, within: frozenset[str] | None = None) -> Descriptors:
    """A page the fallback retries alone travels unshaped."""
    return plain


class KvcrPool:
    """See the module docstring; made by :meth:`KvcrBackend.attach`."""

    def __init__(
        self,
        endpoint: Endpoint,
        layout: PageLayout,
        region: Region,
        runner: Runner,
        policy: TierPolicy,
        query_batch: int,
        progress_thread: bool,
    ) -> None:
        self.name = layout.geometry.name
        self.layout = layout
        self.geometry = layout.geometry
        self.region = region
        self.runner = runner
        self.policy = policy
        self.keys = KeySpace()
        self.policy.live_prefix = self.keys.live_prefix
        self.endpoint = endpoint
        self._query_batch = query_batch
        self._progress_thread = progress_thread
        self._probe: ProbeAgent | None = None
        self._lock = threading.Lock()

    # ---- metadata -------------------------------------------------------------------------

    def contains(self, keys: Sequence[str]) -> int:
        statuses = self.runner.query(self.keys.block_keys(keys))
        for i, status in enumerate(statuses):
            if status not in PRESENT:
                return i
        return len(statuses)

    def begin(self, read: bool, keys: list[str], pages: np.ndarray) -> _Transfer:
        return _Transfer(self, read, keys, pages)

    def delete(self, keys: Sequence[str]) -> int:
        """Forget the present ``keys``: later lookups miss them, and KVCR evicts their blocks
        before any live one (see :mod:`~kvcr_policy_kvcr.policy`)."""
        keys = list(dict.fromkeys(keys))
        blocks = self.keys.block_keys(keys)
        statuses = self.runner.query(blocks)
        rows = zip(keys, blocks, statuses, strict=True)
        present = [(k, b, s) for k, b, s in rows if s in PRESENT]
        if not present:
            return 0
        self.keys.forget([key for key, _, _ in present])
        self.policy.mark_dead([block for _, block, _ in present])
        # A claim and its release make KVCR score each block in DRAM again, now as dead (a
        # fetch of a block in G3 would copy it back into DRAM: those wait for G3's eviction).
        local = [b for _, b, s in present if s == LOCAL]
        if local:
            labels = self.layout.labels
            entries = self.runner.start("fetch", self.runner.kvcr.fetch, local, None, labels)
            handles = [e.release_handle for e in entries.result().values() if e.release_handle]
            self.runner.hold(handles)
            self.runner.release(handles)
        return len(present)

    def clear(self) -> None:
        """Forget every key: a new key epoch; the old blocks are evicted first."""
        self.keys.clear()
        self.policy.live_prefix = self.keys.live_prefix

    # ---- limits and reports ---------------------------------------------------------------

    def probe(self, nbytes: int) -> None:
        """One NIXL transfer of ``nbytes`` from KVCR's DRAM region into the pool's first bytes,
        by an agent built like KVCR's (the limit a restore is measured against)."""
        room = min(self.region.size, self.endpoint.nbytes)
        if nbytes > room:
            message = (
                f"pool {self.name!r}: probe of {nbytes} bytes does not fit (KVCR region "
                f"{self.region.size} bytes, pool {self.endpoint.nbytes} bytes); probe at most "
                f"{room}"
            )
            raise IndicesError(message)
        with self._lock:
            if self.runner.state != "open":
                raise ClosedError(f"pool {self.name!r} is closed: probe() refused")
            if self._probe is None:
                self._probe = ProbeAgent(
                    f"{self.layout.agent}-probe",
                    self._progress_thread,
                    (self.region.address, self.region.size),
                    (self.endpoint.address, self.endpoint.nbytes),
                )
            self._probe.move(nbytes, self.runner.abandon_s)

    def stats(self) -> dict[str, Any]:
        return {
            "page_bytes": self.geometry.page_bytes,
            "slots": self.region.size // self.geometry.page_bytes,
            "agent": self.layout.agent,
            "dead_blocks": self.policy.dead(),
            "runner": self.runner.stats(),
        }

    def audit(self) -> dict[str, Any] | None:
        return self.region.audit().to_dict()

    def close(self) -> None:
        """Wait for KVCR's operations, release claims, close KVCR, and only then free the
        region (kept mapped, and reported leaked, if KVCR could not reach quiescence)."""
        quiescent = self.runner.close()
        with self._lock:
            if self._probe is not None:
                self._probe.close()
                self._probe = None
        self.endpoint = Endpoint(0, 0)  # the pool's buffer may go now
        if quiescent:
            self.region.close()
            return

        def unsafe() -> None:
            raise TransportError("KVCR did not reach quiescence at close")

        try:
            self.region.close(wait=unsafe)
        except TransportError as err:
            log.error("pool %r: KVCR region kept mapped (leaked): %s", self.name, err)


class _Transfer:
    """One get or set on one KVCR pool; see the module docstring."""

    def __init__(self, pool: KvcrPool, read: bool, keys: list[str], pages: np.ndarray) -> None:
        self.pool, self.read, self.keys, self.pages = pool, read, keys, pages
        self.blocks = pool.keys.block_keys(keys)
        self.handles: list[Any] = []
        self.needs: np.ndarray | None = None
        self.first: np.ndarray | None = None  # a write's repeated keys -> first occurrence
        self.local = 0  # a read's leading run claimed up front (in KVCR's DRAM)
        if read:
            self.limit = self._claim()
            return
        self.limit = len(keys)
        if len(set(self.blocks)) != len(self.blocks):
            seen: dict[bytes, int] = {}
            self.first = np.array([seen.setdefault(b, i) for i, b in enumerate(self.blocks)])
            self.needs = self.first == np.arange(len(keys))

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

    def _claim_late(self, positions: np.ndarray) -> list[Any]:
        """Claims for the batch's pages past the leading DRAM run (raise if any fails)."""
        late = [self.blocks[p] for p in positions.tolist() if p >= self.local]
        if not late:
            return []
        claimed, handles = self._fetch(list(dict.fromkeys(late)))
        if claimed < len(set(late)):
            self.pool.runner.release(handles)
            message = f"pool {self.pool.name!r}: KVCR could not bring a page of the batch into DRAM"
            raise TransportError(message)
        return handles

    def _positions_by_round(self, positions: np.ndarray) -> list[np.ndarray]:
        """Positions cut so that no KVCR call names a block twice (a read of one key into two
        pages needs two deliveries)."""
        blocks = self.blocks
        rounds: list[list[int]] = []
        count: dict[bytes, int] = {}
        for position in positions.tolist():
            n = count.get(blocks[position], 0)
            count[blocks[position]] = n + 1
            if n == len(rounds):
                rounds.append([])
            rounds[n].append(position)
        return [np.asarray(r, dtype=np.int64) for r in rounds]

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

    def submit(self, positions: np.ndarray, shape: Shape) -> Future[np.ndarray]:
        late = self._claim_late(positions) if self.read else []
        try:
            rounds = self._positions_by_round(positions)
            started = [(r, self._start(r, shape)) for r in rounds]
        except BaseException:
            self.pool.runner.release(late)
            raise
        done: Future[np.ndarray] = Future()
        left = [len(started)]
        lock = threading.Lock()

        def settle(_: Future[Entries]) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            self.pool.runner.release(late)  # delivered or failed: DRAM may take others
            try:
                self._check(positions, [(r, f.result()) for r, f in started])
            except BaseException as err:
                done.set_exception(err)
            else:
                done.set_result(np.ones(len(positions), dtype=bool))

        for _, future in started:
            future.add_done_callback(settle)
        return done

    def _check(self, positions: np.ndarray, results: list[tuple[np.ndarray, Entries]]) -> None:
        """Raise when any page of the batch did not move (the fallback then retries them)."""
        failed = [
            _status(entries, self.blocks[p])
            for r, entries in results
            for p in r.tolist()
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

    def retry(self, position: int) -> bool:
        one = np.array([position], dtype=np.int64)
        late = self._claim_late(one) if self.read else []
        try:
            entries = self._start(one, _plain).result()
        finally:
            self.pool.runner.release(late)
        return _ok(entries, self.blocks[position])

    def finish(self, moved: np.ndarray) -> list[bool]:
        result = [False] * len(self.keys)
        if self.read:
            self.pool.runner.release(self.handles)
            self.handles = []
            result[: self.limit] = moved.tolist()
            return result
        if self.first is None:
            return [bool(x) for x in moved]
        return [bool(moved[j]) for j in self.first.tolist()]

    def abort(self) -> None:
        self.pool.runner.release(self.handles)
        self.handles = []
