"""The eviction policy handed to KVCR: ``eviction.strategy``, with deleted blocks evicted first.

KVCR (0.1.1) has no call that removes a block. A deleted or cleared key is therefore made
unreachable by the pool (it asks for a new incarnation of the key, see
:mod:`~kvcr_policy_kvcr.keys`), and this policy makes KVCR evict the dead incarnation before
any live block: its eviction score is the lowest possible, and it is dropped, never spilled to
G3. KVCR tells the policy when a block is really gone (``on_remove``), which ends the record.
Everything else is KVCR's own LRU or FIFO policy (with G3 spilling when a G3 tier is set).
"""

from __future__ import annotations

import threading
from typing import Any

from kvcr.policy import FIFOPolicy, G3FIFOPolicy, G3LRUPolicy, KVCachePolicy, LRUPolicy
from kvcr.types import BlockMeta, CacheTier, PlacementAction, PlacementDecision

__all__ = ["DEAD_SCORE", "POLICIES", "TierPolicy"]

#: Lower than any score KVCR's policies give (monotonic-clock timestamps, or 0.0), and finite.
DEAD_SCORE = -1.0e300

#: ``eviction.strategy`` -> KVCR's policy, without and with a G3 tier.
POLICIES: dict[str, tuple[type[KVCachePolicy], type[KVCachePolicy]]] = {
    "lru": (LRUPolicy, G3LRUPolicy),
    "fifo": (FIFOPolicy, G3FIFOPolicy),
}


class TierPolicy(KVCachePolicy):
    """KVCR's ``inner`` policy, except for blocks marked dead."""

    def __init__(self, inner: KVCachePolicy) -> None:
        self.inner = inner
        self.required_tiers = inner.required_tiers
        self._dead: set[bytes] = set()
        self._lock = threading.Lock()
        #: Keys of live blocks start with it (:class:`~kvcr_policy_kvcr.keys.KeySpace`); a
        #: block of an earlier epoch was cleared.
        self.live_prefix = b""

    def mark_dead(self, keys: list[bytes]) -> None:
        with self._lock:
            self._dead.update(keys)

    def dead(self) -> int:
        """Dead blocks KVCR still holds."""
        return len(self._dead)

    def _is_dead(self, key: bytes) -> bool:
        return key in self._dead or not key.startswith(self.live_prefix)

    def decide_ingest(
        self,
        meta: BlockMeta,
        source: CacheTier,
        required_local: bool,
        router_hints: object | None = None,
        framework_hints: object | None = None,
    ) -> PlacementDecision:
        return self.inner.decide_ingest(meta, source, required_local, router_hints, framework_hints)

    def eviction_score(self, meta: BlockMeta, source: CacheTier) -> float:
        if self._is_dead(meta.block_key):
            return DEAD_SCORE
        return self.inner.eviction_score(meta, source)

    def decide_eviction(self, meta: BlockMeta, source: CacheTier) -> PlacementDecision:
        if self._is_dead(meta.block_key):
            return (PlacementAction.DROP, None)
        return self.inner.decide_eviction(meta, source)

    def on_ingest(self, meta: BlockMeta, source: CacheTier) -> None:
        self.inner.on_ingest(meta, source)

    def on_remove(self, meta: BlockMeta) -> None:
        with self._lock:
            self._dead.discard(meta.block_key)
        self.inner.on_remove(meta)

    def on_align_sequence(self, blocks: list[BlockMeta], use_current_time: bool) -> None:
        self.inner.on_align_sequence(blocks, use_current_time)

    def decide_recovery(self, meta: BlockMeta, failure: Any) -> PlacementDecision:
        return self.inner.decide_recovery(meta, failure)
