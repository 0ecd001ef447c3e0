"""KVCRPolicyTier under vLLM's real ``TieringOffloadingManager`` on the CPU: the scheduler side
of vLLM's tiered offloading (its CPU primary tier in a real ``SharedOffloadRegion``, its
cascades, promotions and job bookkeeping), built the way ``TieringOffloadingSpec`` builds it,
with our tier loaded out of tree by ``SecondaryTierFactory``. The GPU side (the offloading
connector's worker) refuses a CPU platform, so the GPU <-> primary copies are played by writing
and reading the primary's rows, as that worker would.
"""

from __future__ import annotations

import mmap
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.support.waiting import wait_until

pytestmark = pytest.mark.vllm

CHUNKS = 4
TIER = {
    "type": "KVCRPolicyTier",
    "module_path": "kvcr_policy.integrations.vllm.tier",
    "overrides": {"placement.capacity_bytes": "16MiB"},
}


@pytest.fixture
def tiering(vllm: None) -> Iterator[Any]:
    from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    from vllm.v1.kv_offload.tiering.manager import (
        CPUPrimaryTierOffloadingManager,
        TieringOffloadingManager,
    )

    region = SharedOffloadRegion(
        engine_id=f"kvcr-test-{uuid.uuid4()}",
        num_chunks=CHUNKS,
        rank=None,
        kv_bytes_per_chunk=mmap.PAGESIZE,
        cpu_page_size=mmap.PAGESIZE,
    )
    primary = CPUPrimaryTierOffloadingManager(num_chunks=CHUNKS, mmap_region=region)
    tier = SecondaryTierFactory.create_secondary_tier(TIER, primary.get_kv_memoryview(), None)
    manager = TieringOffloadingManager(primary, [tier])
    yield manager
    manager.shutdown()


def rows(manager: Any) -> np.ndarray:
    return np.asarray(manager.primary_tier.get_kv_memoryview()).view(np.uint8)


def key(i: int) -> Any:
    from vllm.v1.kv_offload.base import make_offload_key

    return make_offload_key(bytes([i]) * 16, 0)


def chunk_bytes(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, mmap.PAGESIZE, dtype=np.uint8)


def end_step(manager: Any) -> None:
    from vllm.v1.kv_offload.base import ScheduleEndContext

    manager.on_schedule_end(ScheduleEndContext(new_req_ids=[], preempted_req_ids=()))


def store(manager: Any, request: str, numbers: list[int]) -> None:
    """A request's blocks stored GPU -> primary (the rows written), then cascaded."""
    from vllm.v1.kv_offload.base import ReqContext

    ctx = ReqContext(req_id=request)
    manager.on_new_request(ctx)
    keys = [key(i) for i in numbers]
    out = manager.prepare_store(keys, ctx)
    assert out is not None
    for stored, chunk in zip(out.keys_to_store, out.store_spec.chunk_ids, strict=True):
        rows(manager)[chunk] = chunk_bytes(numbers[keys.index(stored)])
    manager.complete_store(out.keys_to_store, ctx)
    manager.on_request_finished(ctx)
    wait_until(lambda: not manager.has_pending_work() or end_step(manager), "cascades", 30)


def lookup(manager: Any, request: str, i: int) -> Any:
    from vllm.v1.kv_offload.base import ReqContext

    ctx = ReqContext(req_id=request)
    manager.on_new_request(ctx)
    return ctx, manager.lookup(key(i), ctx)


def test_a_chunk_evicted_from_the_primary_comes_back_byte_exact(tiering: Any) -> None:
    from vllm.v1.kv_offload.base import LookupResult

    store(tiering, "a", [0, 1, 2, 3])
    store(tiering, "b", [4, 5, 6, 7])  # the primary holds 4 chunks: 0..3 are gone from it
    tier = tiering.secondary_tiers[0]
    assert tier.pipeline.stats().to_dict()["pages_written"] == 8
    ctx, first = lookup(tiering, "c", 1)
    assert first is LookupResult.HIT_PENDING  # found in our tier: promotion under way
    end_step(tiering)  # vLLM flushes the promotion: our submit_load
    found = wait_until(
        lambda: tiering.lookup(key(1), ctx) is LookupResult.HIT or end_step(tiering),
        "the promotion",
        30,
    )
    assert found
    spec = tiering.prepare_load([key(1)], ctx)
    assert np.array_equal(rows(tiering)[spec.chunk_ids[0]], chunk_bytes(1))
    tiering.complete_load([key(1)], ctx)
    tiering.on_request_finished(ctx)


def test_a_chunk_no_tier_has_is_a_miss(tiering: Any) -> None:
    from vllm.v1.kv_offload.base import LookupResult

    store(tiering, "a", [0])
    ctx, result = lookup(tiering, "c", 9)
    assert result is LookupResult.MISS
    tiering.on_request_finished(ctx)


def test_a_failed_promotion_is_reported_and_the_slot_released(tiering: Any) -> None:
    from vllm.v1.kv_offload.base import LookupResult

    store(tiering, "a", [0, 1, 2, 3])
    store(tiering, "b", [4, 5, 6, 7])
    tier = tiering.secondary_tiers[0]
    ctx, first = lookup(tiering, "c", 2)
    assert first is LookupResult.HIT_PENDING
    tier.pipeline.clear()  # the page is gone before the promotion runs
    end_step(tiering)
    wait_until(lambda: not tiering.has_pending_work() or end_step(tiering), "the promotion", 30)
    end_step(tiering)
    assert tiering.lookup(key(2), ctx) is LookupResult.MISS
    tiering.on_request_finished(ctx)


def test_reset_drains_every_job_first(tiering: Any) -> None:
    store(tiering, "a", [0, 1])
    tiering.reset_cache()  # drain_jobs, then the primary is reset
    assert not tiering.has_pending_work()
