"""Tenants and pools that share one real master never meet (red team 2026-12-c, C2 and C3).

Each case runs against a plain master (the one the plugin starts by default: tenants are kept
apart by the keys alone) and against a master that enforces tenants (``--enable_multi_tenants``
with a tenant quota policy, :class:`~kvcr_policy_mooncake.master.MasterProcess`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kvcr_policy.geometry import PoolGeometry
from tests.plugins.mooncake.mooncake_helpers import GEO, need_mooncake, pipeline_on
from tests.support.pools import pages_of, pool_buffer, token_indices

pytestmark = [pytest.mark.mooncake]

N = 16
TENANTS = {"tenant-one": 32 << 20, "tenant-two": 32 << 20}
#: The same 32 KiB pages as GEO, laid out another way.
LAYER_FIRST = PoolGeometry("kv", "layer_first", 2, 4, 64, "float16", 16, 16 * 128)


@pytest.fixture(scope="module", params=["plain", "enforcing"])
def master(request: pytest.FixtureRequest) -> Iterator[Any]:
    need_mooncake()
    from kvcr_policy_mooncake.master import MasterProcess
    from kvcr_policy_mooncake.segment import SegmentProcess

    tenants = TENANTS if request.param == "enforcing" else None
    with MasterProcess(tenants=tenants) as process:
        holder = SegmentProcess(process.address, 64 << 20)
        try:
            yield process
        finally:
            holder.stop()


def _filled(geometry: PoolGeometry, seed: int) -> tuple[Any, np.ndarray]:
    buffer = pool_buffer(geometry)
    pages = pages_of(buffer, geometry)
    pages[:] = np.random.default_rng(seed).integers(0, 256, pages.shape, dtype=np.uint8)
    return buffer, pages


def test_two_tenants_with_the_same_pool_and_keys_never_meet(master: Any, request: Any) -> None:
    keys = [f"{request.node.callspec.id}-{i}" for i in range(N)]
    here, there = (
        token_indices(range(N), GEO.page_size),
        token_indices(range(N, 2 * N), GEO.page_size),
    )
    one_buffer, one = _filled(GEO, 1)
    two_buffer, two = _filled(GEO, 2)
    stored_one, stored_two = one[:, :N].copy(), two[:, :N].copy()
    with (
        pipeline_on(master, backend__options__tenant="tenant-one") as first,
        pipeline_on(master, backend__options__tenant="tenant-two") as second,
    ):
        first.register_pool("kv", GEO, one_buffer)
        second.register_pool("kv", GEO, two_buffer)
        assert first.set(keys, here) == [True] * N
        assert second.exists(keys) == 0  # the same pool, layout and keys: another tenant's
        assert second.get(keys, there) == [False] * N
        assert second.set(keys, here) == [True] * N  # its own pages, not "already there"
        assert second.get(keys, there) == [True] * N
        assert np.array_equal(two[:, N : 2 * N], stored_two)
        second.clear()  # its own pool only
        assert second.exists(keys) == 0
        assert first.get(keys, there) == [True] * N
        assert np.array_equal(one[:, N : 2 * N], stored_one)


def test_a_tenant_the_enforcing_master_does_not_name_stores_nothing_and_says_why(
    master: Any, caplog: pytest.LogCaptureFixture
) -> None:
    if master.policy_path is None:
        pytest.skip("a plain master takes any tenant")
    buffer = pool_buffer(GEO)
    with pipeline_on(master, backend__options__tenant="tenant-three") as stranger:
        stranger.register_pool("kv", GEO, buffer)
        assert stranger.set(["a", "b"], token_indices(range(2), GEO.page_size)) == [False] * 2
    assert "tenant 'tenant-three'" in caplog.text
    assert "-1701 TENANT_NOT_REGISTERED" in caplog.text


def test_a_pool_name_holding_separators_never_reaches_another_pools_keys(
    master: Any, request: Any
) -> None:
    """A pool named ``kva@<digest of kva's layout>/x`` once wrote objects that pool ``kva``
    read as its own (16 hits of another layout's bytes), and kva's ``clear()`` removed them."""
    from kvcr_policy_mooncake.objects import layout_digest

    tag = request.node.callspec.id
    keys = [f"{tag}-{i}" for i in range(N)]
    here = token_indices(range(N), GEO.page_size)
    other_buffer, _ = _filled(LAYER_FIRST, 3)
    own_buffer, _ = _filled(GEO, 4)
    strange = f"kva@{layout_digest(GEO)}/x"
    aliases = [f"x@{layout_digest(LAYER_FIRST)}/{key}" for key in keys]
    tenant = {"backend__options__tenant": "tenant-one"} if master.policy_path else {}
    with pipeline_on(master, **tenant) as b, pipeline_on(master, **tenant) as a:
        b.register_pool(strange, LAYER_FIRST, other_buffer)
        a.register_pool("kva", GEO, own_buffer)
        assert b.set(keys, here) == [True] * N
        assert a.exists(aliases) == 0
        assert a.get(aliases, token_indices(range(N, 2 * N), GEO.page_size)) == [False] * N
        a.clear()
        assert b.exists(keys) == N
        b.clear()
        assert b.exists(keys) == 0
