"""SGLang HiCache -> kvcr_policy -> KVCR: the seed's deployment, end to end on real SGLang 0.5.23
host pools, built by SGLang's own factory, with a TOML profile that selects the ``kvcr`` backend
and sets every control. Bytes are compared as SGLang itself reads them (``get_data_page``)."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import kvcr_missing
from tests.integrations.conftest import round_trip, same_tensors
from tests.support.installs import missing

pytestmark = pytest.mark.sglang

LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]

#: Every control from the profile: batching, windows, placement, thread tuning, fallback.
PROFILE = """
[backend]
name = "kvcr"

[batching]
read_batch_pages = 3
query_batch_keys = 4
window_batches = 2

[placement]
prefault = true
huge_pages = "prefer"

[thread_tuning]
switch_interval_s = 0.0005

[fallback]
strategy = "sparse"
max_retries = 1
"""


@pytest.fixture
def kvcr_storage(make_backend: Any, tmp_path: Path) -> Any:
    """``kvcr_storage(config_fields=None, **extra)``: our HiCache backend through SGLang's
    factory, with the profile above (a file, as a deployment names it in extra_config)."""
    reason = kvcr_missing()
    if reason is not None:
        missing(reason)
    profile = tmp_path / "kvcr-node.toml"
    profile.write_text(PROFILE, encoding="utf-8")

    def make(config_fields: dict[str, Any] | None = None, **extra: Any) -> Any:
        backend = make_backend(config_fields, profile=str(profile), **extra)
        assert backend.pipeline.backend.name == "kvcr"
        return backend

    return make


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mha_pools_round_trip_byte_exact_through_kvcr(
    sg: SimpleNamespace, kit: SimpleNamespace, kvcr_storage: Any, layout: str
) -> None:
    backend = kvcr_storage()
    pool = kit.mha(layout)
    backend.register_mem_pool_host(pool)
    backend.register_mem_host_pool_v2(pool, sg.hs.PoolName.KV)
    assert not backend.refused
    round_trip(sg, kit, backend, pool, n=10, seed=11)
    stats = backend.pipeline.stats()
    assert stats.batches >= 4 * 4  # 10 pages in batches of 3, each way, v1 and v2
    audit = backend.pipeline.audit()["kv"]
    assert audit["name"] == "kvcr:kv" and audit["prefaulted"]


@pytest.mark.parametrize("layout", MLA_LAYOUTS)
def test_mla_pools_round_trip_byte_exact_through_kvcr(
    sg: SimpleNamespace, kit: SimpleNamespace, kvcr_storage: Any, layout: str
) -> None:
    backend = kvcr_storage({"is_mla_model": True})
    pool = kit.mla(layout)
    backend.register_mem_pool_host(pool)
    assert backend.pools["kv"].geometry.mla
    round_trip(sg, kit, backend, pool, n=10, seed=11)


def test_the_tensor_api_round_trips_through_kvcr(
    sg: SimpleNamespace, kit: SimpleNamespace, kvcr_storage: Any
) -> None:
    backend = kvcr_storage(interface_v1=0)
    pool = kit.mha("page_first")
    backend.register_mem_pool_host(pool)
    size = pool.page_size
    pages = [pool.get_data_page(p * size, flat=True).clone() for p in (3, 9, 11)]
    assert backend.batch_set(["a", "b", "c"], pages)
    dummies = [pool.get_dummy_flat_data_page() for _ in range(4)]
    got = backend.batch_get(["a", "b", "c", "zz"], dummies)
    assert got[3] is None
    for page, restored in zip(pages, got[:3], strict=True):
        assert same_tensors(restored.view(sg.torch.int16), page.view(sg.torch.int16))


def test_ranks_are_isolated(sg: SimpleNamespace, kit: SimpleNamespace, kvcr_storage: Any) -> None:
    ranks = [kvcr_storage({"tp_rank": r, "tp_size": 2}) for r in (0, 1)]
    pools = [kit.mha("page_first", seed=r) for r in (0, 1)]
    for backend, pool in zip(ranks, pools, strict=True):
        backend.register_mem_pool_host(pool)
    keys = [f"shared-{i}" for i in range(6)]
    assert ranks[0].batch_set_v1(keys, kit.indices(pools[0], range(6))) == [True] * 6
    assert ranks[1].batch_exists(keys) == 0
    before = kit.page(pools[1], 20)
    assert ranks[1].batch_get_v1(keys, kit.indices(pools[1], range(20, 26))) == [False] * 6
    assert same_tensors(kit.page(pools[1], 20), before)
    assert ranks[0].batch_exists(keys) == 6
    described = [b.pipeline.stats().transport for b in ranks]
    agents = [b.pipeline.stats().pools["kv"]["agent"] for b in ranks]
    ports = [d["process"]["listen_ports"]["kv"]["value"] for d in described]
    assert agents[0] != agents[1] and ports[0] != ports[1]  # a runner and listener each


def test_a_kvcr_failure_mid_restore_gives_shaped_misses(
    sg: SimpleNamespace,
    kit: SimpleNamespace,
    kvcr_storage: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the first batch, every NIXL transfer into the host pool fails: SGLang gets the
    leading run that arrived, the rest as misses, never an exception or a wrong page."""
    from kvcr.progress import _KVCRProgress

    backend = kvcr_storage()
    pool = kit.mha("layer_first", pages=64)
    backend.register_mem_pool_host(pool)
    src = list(range(12))
    expected = [kit.page(pool, p) for p in src]
    keys = [f"f-{i}" for i in range(12)]
    assert backend.batch_set_v1(keys, kit.indices(pool, src)) == [True] * 12
    broken = threading.Event()
    original = _KVCRProgress.submit_transfer

    def submit_transfer(self: Any, operation: str, local: Any, remote: Any, **kw: Any) -> Any:
        into_pool = any(getattr(r, "framework", False) for r in remote)
        if into_pool and broken.is_set():
            raise RuntimeError("injected NIXL failure")
        if into_pool:
            broken.set()  # this one (the first batch) passes
        return original(self, operation, local, remote, **kw)

    monkeypatch.setattr(_KVCRProgress, "submit_transfer", submit_transfer)
    dst = list(range(30, 42))
    got = backend.batch_get_v1(keys, kit.indices(pool, dst))
    assert got == [True] * 3 + [False] * 9  # one batch of 3 arrived
    for page, want in zip(dst[:3], expected[:3], strict=True):
        assert same_tensors(kit.page(pool, page), want)
    kv = sg.hs.PoolName.KV
    take = sg.hs.PoolTransfer(name=kv, host_indices=kit.indices(pool, dst), keys=keys)
    assert backend.batch_get_v2([take]) == {kv: [False] * 12}  # shaped as SGLang expects
    monkeypatch.undo()  # the transport recovers: the same pages restore again
    assert backend.batch_get_v1(keys, kit.indices(pool, dst)) == [True] * 12
    assert all(same_tensors(kit.page(pool, d), e) for d, e in zip(dst, expected, strict=True))


def test_a_dead_kvcr_turns_every_call_into_misses(
    sg: SimpleNamespace,
    kit: SimpleNamespace,
    kvcr_storage: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kvcr.progress import _KVCRProgress

    backend = kvcr_storage()
    pool = kit.mha("page_head")
    backend.register_mem_pool_host(pool)
    keys = ["d0", "d1", "d2"]
    assert backend.batch_set_v1(keys, kit.indices(pool, [0, 1, 2])) == [True] * 3

    died = threading.Event()

    def dead(self: Any) -> bool:
        died.set()
        raise RuntimeError("injected: the KVCR progress thread died")

    monkeypatch.setattr(_KVCRProgress, "_run_one_iteration", dead)
    # Evidence before the calls: KVCR's progress thread ran its failing iteration (else a get
    # racing the iteration already under way could still complete).
    assert died.wait(10), "KVCR's progress thread never iterated again"
    assert backend.batch_get_v1(keys, kit.indices(pool, [5, 6, 7])) == [False] * 3
    assert backend.batch_exists(keys) == 0
    assert backend.batch_set_v1(["d3"], kit.indices(pool, [3])) == [False]
    tier = backend.pipeline._pools["kv"][1]
    backend.close()  # KVCR stopped: the region is freed, not leaked
    assert tier.audit()["leaked"] is False  # the region's own (Pipeline.audit() refuses now)
