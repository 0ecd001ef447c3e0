"""SGLang's factory builds our backend on the ``file`` tier and on the ``cascade`` (DRAM in
front of it): pages round-trip byte-exact through HiCache's v1 and v2 calls, and survive the
backend being closed and built again."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.integrations.conftest import round_trip, same_tensors
from tests.integrations.sglang.conftest import overrides_for

pytestmark = pytest.mark.sglang


def _overrides(tier: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    return overrides_for(tier, request)


TIERS = ["file", "cascade"]


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_head"])
def test_mha_pool_round_trips(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, layout: str, tier: str,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    backend = make_backend(overrides=_overrides(tier, request))
    pool = kit.mha(layout)
    backend.register_mem_pool_host(pool)
    assert backend.pipeline.stats().to_dict()["transport"]["name"] == tier
    round_trip(sg, kit, backend, pool, n=8, seed=7)


@pytest.mark.parametrize("tier", TIERS)
def test_mla_pool_round_trips(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, tier: str,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    backend = make_backend({"is_mla_model": True}, overrides=_overrides(tier, request))
    pool = kit.mla("page_first")
    backend.register_mem_pool_host(pool)
    round_trip(sg, kit, backend, pool, n=8, seed=7)


def test_pages_survive_a_restart_of_the_backend(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, request: pytest.FixtureRequest
) -> None:
    overrides = _overrides("file", request)
    first = make_backend(overrides=overrides)
    pool = kit.mha("page_first")
    first.register_mem_pool_host(pool)
    keys = [f"warm-{i}" for i in range(6)]
    expected = [kit.page(pool, p) for p in range(6)]
    assert first.batch_set_v1(keys, kit.indices(pool, list(range(6)))) == [True] * 6
    first.close()
    second = make_backend(overrides=overrides)
    second.register_mem_pool_host(pool)
    assert second.batch_exists(keys) == 6
    assert second.batch_get_v1(keys, kit.indices(pool, list(range(10, 16)))) == [True] * 6
    assert all(same_tensors(kit.page(pool, 10 + i), e) for i, e in enumerate(expected))
