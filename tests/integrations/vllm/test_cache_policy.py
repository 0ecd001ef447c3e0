"""Our eviction strategies as vLLM's ``CachePolicy``: with ``lru`` they choose what vLLM's own
``LRUCachePolicy`` chooses, under any sequence of vLLM's calls; and vLLM's real
``CPUOffloadingManager`` loads the class out of tree."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.integrations.vllm.conftest import need_vllm

pytestmark = pytest.mark.vllm

CAPACITY = 6
ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "touch", "evict", "remove", "pin", "unpin"]),
        st.lists(st.integers(0, 11), min_size=1, max_size=4),
        st.integers(0, 3),
    ),
    max_size=60,
)


def policies() -> tuple[Any, Any]:
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    from kvcr_policy.integrations.vllm.cache_policy import KVCRPolicyCachePolicy

    ours = KVCRPolicyCachePolicy(CAPACITY)
    assert ours.policy.name == "lru"  # the schema default (upstream's)
    return LRUCachePolicy(CAPACITY), ours


@settings(max_examples=60, deadline=None)
@given(ops)
def test_lru_chooses_as_vllms_lru(sequence: list) -> None:
    need_vllm()
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

    theirs, ours = policies()
    ctx = ReqContext(req_id="r")
    free = list(range(CAPACITY))

    def k(i: int) -> Any:
        return make_offload_key(bytes([i]) * 8, 0)

    for op, numbers, n in sequence:
        keys = [k(i) for i in dict.fromkeys(numbers)]
        if op == "insert":
            for key in keys:
                if theirs.get(key) is None and free:
                    slot = free.pop()
                    for policy in (theirs, ours):
                        chunk = ChunkStatus(slot)
                        chunk.ref_cnt = 0
                        policy.insert(key, chunk)
        elif op == "touch":
            theirs.touch(keys, ctx)
            ours.touch(keys, ctx)
        elif op == "evict":
            protected = set(keys[:1])
            a, b = theirs.evict(n, protected), ours.evict(n, protected)
            assert (a is None) == (b is None)
            if a is not None and b is not None:
                assert [key for key, _ in a] == [key for key, _ in b]
                free.extend(chunk.chunk_id for _, chunk in a)
        elif op == "remove":
            for key in keys:
                if theirs.get(key) is not None and theirs.get(key).ref_cnt == 0:
                    free.append(theirs.get(key).chunk_id)
                    theirs.remove(key)
                    ours.remove(key)
        else:  # pin / unpin: ref_cnt and the evictable marks, as CPUOffloadingManager does
            for key in keys:
                for policy in (theirs, ours):
                    chunk = policy.get(key)
                    if chunk is None:
                        continue
                    if op == "pin" and chunk.ref_cnt == 0:
                        chunk.ref_cnt = 1
                        policy.mark_non_evictable(key)
                    elif op == "unpin" and chunk.ref_cnt == 1:
                        chunk.ref_cnt = 0
                        policy.mark_evictable(key)


def test_vllms_cpu_tier_loads_it_and_evicts_through_it(vllm: None, monkeypatch: Any) -> None:
    from vllm.v1.kv_offload.base import ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    monkeypatch.setenv("KVCR_POLICY_EVICTION__STRATEGY", "fifo")
    manager = CPUOffloadingManager(
        num_chunks=2,
        cache_policy="KVCRPolicyCachePolicy",
        cache_policy_module_path="kvcr_policy.integrations.vllm.cache_policy",
    )
    assert type(manager._policy).__name__ == "KVCRPolicyCachePolicy"
    assert manager._policy.policy.name == "fifo"
    ctx = ReqContext(req_id="r")
    manager.on_new_request(ctx)
    keys = [make_offload_key(bytes([i]) * 8, 0) for i in range(3)]
    for key in keys[:2]:
        out = manager.prepare_store([key], ctx)
        manager.complete_store(out.keys_to_store, ctx)
    manager.touch([keys[0]], ctx)  # fifo: a use does not reorder
    out = manager.prepare_store([keys[2]], ctx)
    assert out is not None and list(out.evicted_keys) == [keys[0]]
