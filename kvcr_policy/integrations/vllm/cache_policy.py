"""KVCRPolicyCachePolicy: kvcr_policy's eviction strategies as the ``CachePolicy`` of vLLM's
CPU offloading tier (``CPUOffloadingSpec`` and the primary tier of ``TieringOffloadingSpec``)::

    "eviction_policy": "KVCRPolicyCachePolicy",
    "cache_policy_module_path": "kvcr_policy.integrations.vllm.cache_policy"

vLLM builds it with nothing but its capacity, so the strategy comes from kvcr_policy's own
configuration as any process loads it: ``eviction.strategy`` of the profile named by
``KVCR_POLICY_PROFILE`` and ``KVCR_POLICY_EVICTION__STRATEGY`` (``lru``, ``fifo`` or a plugin's,
such as the example plugin's ``s3fifo``). Our policies order slots; here a slot is vLLM's chunk
id, held by one key at a time. A chunk vLLM is reading or writing (``ref_cnt != 0``) or that
the caller protects is never chosen, and an eviction that cannot free ``n`` chunks changes
nothing, as vLLM's contract asks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus

from ... import load_config, make_plugin_manager
from ...config.schema import strategy_name

__all__ = ["KVCRPolicyCachePolicy", "eviction_policy"]


def eviction_policy(capacity: int) -> Any:
    """A fresh policy of the configured eviction strategy for ``capacity`` slots."""
    config = load_config().config
    registry = make_plugin_manager(config).registry
    section = config.eviction
    spec = registry.get("eviction", strategy_name(config, "eviction"))
    return spec.create(section, options=section.options).new_policy(capacity)


class KVCRPolicyCachePolicy(CachePolicy):
    """See the module docstring."""

    def __init__(self, cache_capacity: int) -> None:
        super().__init__(cache_capacity)
        self.policy = eviction_policy(cache_capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        self._keys: dict[int, OffloadKey] = {}  # slot (chunk id) -> key

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus) -> None:
        self.chunks[key] = chunk
        self._keys[chunk.chunk_id] = key
        self.policy.admit(chunk.chunk_id, key)

    def remove(self, key: OffloadKey) -> None:
        chunk = self.chunks.pop(key)
        del self._keys[chunk.chunk_id]
        self.policy.forget(chunk.chunk_id)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        # Last key first, as vLLM's LRU does: a prompt's head is the most recently used.
        for key in reversed(list(keys)):
            chunk = self.chunks.get(key)
            if chunk is not None:
                self.policy.touch(chunk.chunk_id)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n == 0:
            return []

        def evictable(slot: int) -> bool:
            key = self._keys[slot]
            return key not in protected and self.chunks[key].ref_cnt == 0

        slots = self.policy.victims(n, evictable)
        if len(slots) < n:
            return None
        chosen = []
        for slot in slots:
            key = self._keys.pop(slot)
            self.policy.forget(slot)
            chosen.append((key, self.chunks.pop(key)))
        return chosen

    def clear(self) -> None:
        self.chunks.clear()
        self._keys.clear()
        self.policy = eviction_policy(self.cache_capacity)
