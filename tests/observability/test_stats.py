"""The host memory a pipeline reports: its pools' and, once, its backend's own."""

from __future__ import annotations

from kvcr_policy.observability.stats import host_memory


def test_host_memory_sums_the_pools_and_the_backend_s_own_once() -> None:
    pools = {"a": {"tier_bytes": 10, "pinned_bytes": 2, "registration_s": 0.5}, "b": None}
    assert host_memory(pools) == {"tier_bytes": 10, "pinned_bytes": 2, "registration_s": 0.5}
    backend = {"name": "mooncake", "tier_bytes": 64}
    assert host_memory(pools, backend)["tier_bytes"] == 74
    assert host_memory(pools, {"name": "dram"})["tier_bytes"] == 10
