"""One pool on both levels of the cascade: where each key is, demotion and promotion.

- **Demotion on eviction.** Before a write into DRAM would evict, the keys the DRAM store's
  policy would give up next (:meth:`~..dram.store.Store.victims`) are written to disk from
  the DRAM tier itself, claimed meanwhile, if admitted (used at least ``admit_hits`` times in
  DRAM); the write then evicts them as it would have.
- **Promotion on a hit.** A page read from disk is also written into DRAM, from the pool
  page it was just read into (``promote``).

A key may be on both levels (demoted, then promoted again); DRAM is asked first. Each
level's figures (capacity, bytes, read and write rates) are in :meth:`CascadePool.stats`.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ...descriptors import Descriptors
from ..dram.backend import DramPool
from ..file.backend import FilePool
from ..file.engine import PoolSide
from ..file.tier import Moved
from ..file.transfer import FileWrite
from ..reporting import LevelUsage, TierUsage, stats_of

__all__ = ["CascadePool", "plain"]

log = logging.getLogger("kvcr_policy.backends.cascade")


def plain(descriptors: Descriptors, within: frozenset[str] | None = None) -> Descriptors:
    """The mover's shape for a transfer the cascade drives itself: descriptors as built."""
    return descriptors


def run_write(transfer: Any) -> list[bool]:
    """Drive one write transfer to its end: every page it needs, then finish."""
    moved = np.zeros(transfer.limit, dtype=bool)
    positions = np.flatnonzero(transfer.needs[: transfer.limit])
    try:
        if len(positions):
            moved[positions] = transfer.submit(positions, plain).result()
    except BaseException:
        transfer.abort()
        raise
    result: list[bool] = transfer.finish(moved)
    return result


class CascadePool:
    """One pool's two levels; see the module docstring."""

    #: A get moves pages between the levels and counts each level's reads: the pipeline
    #: refreshes the usage metrics after it as after a set.
    usage_on_read = True

    def __init__(self, name: str, front: DramPool, back: FilePool, admit_hits: int,
                 promote: bool) -> None:  # fmt: skip
        self.name = name
        self.front, self.back = front, back
        self.admit_hits, self.promote_hits = admit_hits, promote
        self.region = PoolSide(front.tier_side.endpoint.address, front.tier_side.geometry)
        self.uses: OrderedDict[str, int] = OrderedDict()
        self.uses_max = 2 * front.store.capacity
        self.lock = threading.Lock()
        self.dram_reads = Moved(front.tier_side.geometry.page_bytes)  # disk: FileTier.moved
        self.counts = {
            "demoted": 0,
            "not_admitted": 0,
            "promoted": 0,
            "dram_hits": 0,
            "file_hits": 0,
        }

    def used(self, keys: list[str]) -> None:
        """One use of each key in DRAM (a set, or a hit)."""
        with self.lock:
            for key in keys:
                self.uses[key] = self.uses.pop(key, 0) + 1
            while len(self.uses) > self.uses_max:
                self.uses.popitem(last=False)

    def where(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Per key: in DRAM; on disk (and not in DRAM)."""
        front = self.front.store.lookup(keys) >= 0
        back = (self.back.tier.store.lookup(keys) >= 0) & ~front
        return front, back

    def contains(self, keys: Any) -> int:
        keys = list(keys)
        front, back = self.where(keys)
        either = front | back
        misses = np.flatnonzero(~either)
        return int(misses[0]) if len(misses) else len(keys)

    def make_room(self, count: int, keep: list[str] | None = None) -> None:
        """Demote what a write of ``count`` new pages into DRAM would evict (never one of
        ``keep``, the write's own keys)."""
        store = self.front.store
        need = count - store.stats().free
        if need <= 0:
            return
        victims = store.victims(need, keep or ())
        with self.lock:
            admitted = [k for k in victims if self.uses.get(k, 0) >= self.admit_hits]
            self.counts["not_admitted"] += len(victims) - len(admitted)
        on_disk = self.back.tier.store.lookup(admitted) >= 0
        kept = [k for k, there in zip(admitted, on_disk.tolist(), strict=True) if there]
        admitted = [k for k, there in zip(admitted, on_disk.tolist(), strict=True) if not there]
        demoted: list[str] = []
        if admitted:
            claim = store.claim(admitted, distinct=True)
            try:
                keys = list(claim.keys)
                if keys:
                    done = run_write(FileWrite(self.back.tier, self.region, keys, claim.slots))
                    demoted = [key for key, ok in zip(keys, done, strict=False) if ok]
            except Exception as err:  # a page not demoted is only a page evicted
                message = "pool %r: demoting %d pages to disk failed: %s"
                log.warning(message, self.name, len(admitted), err)
            finally:
                store.release(claim)
        # Their slots are what the write would have evicted (the claim counted as a use, so
        # the policy would now choose others): freed here; pages already on disk too.
        store.delete([*demoted, *kept])
        self.counts["demoted"] += len(demoted)

    def new_keys(self, keys: list[str]) -> int:
        """How many of ``keys`` DRAM does not hold."""
        return len(keys) - int(np.count_nonzero(self.front.store.lookup(keys) >= 0))

    def write(self, keys: list[str], pages: np.ndarray) -> Any:
        new = self.new_keys(keys)
        self.make_room(new, keys)
        self.used(keys)
        return self.front.write(keys, pages)

    def promote(self, keys: list[str], pages: np.ndarray) -> None:
        """Copy pages just read from disk into DRAM (from the pool)."""
        if not self.promote_hits or not keys:
            return
        try:
            self.make_room(self.new_keys(keys), keys)
            self.used(keys)
            done = run_write(self.front.write(keys, pages))
            self.counts["promoted"] += sum(done)
        except Exception as err:  # the read succeeded; DRAM just does not hold the pages
            log.warning("pool %r: promoting %d pages failed: %s", self.name, len(keys), err)

    def delete(self, keys: Any) -> int:
        """Delete ``keys`` from both levels; how many were present on either."""
        keys = list(dict.fromkeys(keys))
        front, back = self.where(keys)
        self.front.delete(keys)
        self.back.delete(keys)
        return int(np.count_nonzero(front | back))

    def clear(self) -> None:
        self.front.clear()
        self.back.clear()

    def probe(self, nbytes: int) -> None:
        self.front.probe(nbytes)

    def read_from_dram(self, hits: int, seconds: float) -> None:
        """A get found ``hits`` pages in DRAM; the call took ``seconds``."""
        with self.lock:
            self.counts["dram_hits"] += hits
            if hits:
                self.dram_reads.add(True, hits, seconds)

    def stats(self) -> dict[str, Any]:
        """Each level's own figures, its capacity and restore rate (read bytes over the
        seconds of the gets that read them), then demotions, promotions and hits."""
        reads, page = self.dram_reads.figures(), self.region.geometry.page_bytes
        dram = {**stats_of(self.front), "capacity_bytes": self.front.store.capacity * page,
                **{k: reads[k] for k in ("read_bytes", "read_s", "read_gbps")}}  # fmt: skip
        return {"dram": dram, "file": stats_of(self.back), **self.counts}

    def usage(self) -> TierUsage:
        a, b = self.front.usage(), self.back.usage()
        dram, file = self.dram_reads.figures(), self.back.tier.moved.figures()
        levels = (
            LevelUsage("dram", a.capacity_bytes, a.used_bytes, dram["read_bytes"],
                       dram["read_s"], self.counts["dram_hits"]),
            LevelUsage("file", b.capacity_bytes, b.used_bytes, file["read_bytes"],
                       file["read_s"], self.counts["file_hits"]),
        )  # fmt: skip
        return TierUsage(a.capacity_bytes + b.capacity_bytes, a.used_bytes + b.used_bytes,
                         a.evictions + b.evictions, levels)  # fmt: skip

    def close(self) -> None:
        """Nothing of its own: each level's backend closes its pools."""
