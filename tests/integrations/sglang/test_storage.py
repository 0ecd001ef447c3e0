"""KVCRPolicyStorage against the real SGLang 0.5.23 classes: factory, host pools, v0/v1/v2.

Every round trip compares bytes as SGLang itself reads them (``get_data_page``), never through
kvcr_policy's own geometry, so a wrong layout model cannot pass.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from kvcr_policy.errors import ConfigError, TierMemoryError
from kvcr_policy.memory.linux import use_roots
from tests.integrations.conftest import round_trip, same_tensors
from tests.integrations.sglang.host_pools import interleave
from tests.support.cgroups import GIB, FakeHost

pytestmark = pytest.mark.sglang

EXTRA = "SGLang --hicache-storage-backend-extra-config"

LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mha_pool_round_trips_through_v1_and_v2(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, layout: str
) -> None:
    backend = make_backend()
    pool = kit.mha(layout)
    backend.register_mem_pool_host(pool)
    backend.register_mem_host_pool_v2(pool, sg.hs.PoolName.KV)  # the anchor, again: one pool
    assert not backend.refused
    round_trip(sg, kit, backend, pool, n=8, seed=7)


@pytest.mark.parametrize("layout", MLA_LAYOUTS)
def test_mla_pool_round_trips_through_v1_and_v2(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, layout: str
) -> None:
    backend = make_backend({"is_mla_model": True})
    pool = kit.mla(layout)
    backend.register_mem_pool_host(pool)
    assert backend.pools["kv"].geometry.mla
    round_trip(sg, kit, backend, pool, n=8, seed=7)


def test_factory_builds_our_class_with_the_throughput_profile(
    sg: SimpleNamespace, make_backend: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="kvcr_policy"):
        backend = make_backend(profile="throughput", prefetch_threshold=256, tp_lcm_size=None)
    assert type(backend) is sg.backend.KVCRPolicyStorage
    assert backend.options.interface_v1
    assert backend.loaded.config.batching.read_batch_pages == 256
    text = caplog.text
    assert "profile" in text and "throughput.toml" in text
    assert "batching.read_batch_pages = 256 (from profile" in text
    extra = "SGLang --hicache-storage-backend-extra-config"
    assert f"placement.capacity_bytes = 67108864 (from {extra} ['overrides']" in text


def test_bad_extra_config_is_refused_with_the_known_keys(make_backend: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        make_backend(profil="throughput", overrides=["x"])
    text = str(caught.value)
    assert "extra_config.profil" in text and "did you mean 'profile'" in text
    assert "kvcr_policy reads profile, overrides" in text and "prefetch_*" in text
    assert "extra_config.overrides" in text and "expected a JSON object" in text
    with pytest.raises(ConfigError, match="no bundled profile or file named 'fast'"):
        make_backend(profile="fast")
    with pytest.raises(ConfigError, match=r"batching\.read_batch_pages"):
        make_backend(overrides={"batching.read_batch_pages": 0})


def test_factory_reports_a_missing_loader_field(sg: SimpleNamespace, storage_config: Any) -> None:
    config = storage_config({"backend_name": "kvcr_policy", "class_name": "KVCRPolicyStorage"})
    with pytest.raises(ValueError, match="Missing required field 'module_path'"):
        sg.StorageBackendFactory.create_backend("dynamic", config, None)


def test_usable_prefix_over_pools_matches_hicache_file(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, storage_config: Any, tmp_path: Any
) -> None:
    hs = sg.hs
    kv, swa, indexer = hs.PoolName.KV, hs.PoolName.SWA, hs.PoolName.INDEXER
    file_backend = hs.HiCacheFile(storage_config({"file_storage_path": str(tmp_path)}))
    ours = make_backend()
    kv_pool, swa_pool = kit.mha("page_first", seed=1), kit.mha("layer_first", seed=2)
    keys = [f"k{i}" for i in range(6)]
    for backend in (file_backend, ours):
        backend.register_mem_pool_host(kv_pool)
        backend.register_mem_host_pool_v2(kv_pool, kv)
        backend.register_mem_host_pool_v2(swa_pool, swa)

        def put(name: Any, pool: Any, chosen: list[int], backend: Any = backend) -> None:
            transfer = hs.PoolTransfer(
                name=name, host_indices=kit.indices(pool, chosen), keys=[keys[i] for i in chosen]
            )
            assert backend.batch_set_v2([transfer]) == {name: [True] * len(chosen)}

        put(kv, kv_pool, [0, 1, 2, 3, 4, 5])
        put(swa, swa_pool, [0, 1, 2, 4, 5])

    def query(backend: Any, policy: Any, trailing: int) -> tuple[Any, ...]:
        transfer = hs.PoolTransfer(name=swa, keys=keys[:trailing], hit_policy=policy)
        result = backend.batch_exists_v2(keys, [transfer])
        return result.kv_hit_pages, result.extra_pool_hit_pages, result.restorable_prefix_pages

    for policy, trailing in [
        (hs.PoolHitPolicy.ALL_PAGES, 1),
        (hs.PoolHitPolicy.TRAILING_PAGES, 1),
        (hs.PoolHitPolicy.TRAILING_PAGES, 2),
        (hs.PoolHitPolicy.TRAILING_PAGES, 3),
    ]:
        assert query(ours, policy, trailing) == query(file_backend, policy, trailing)
    assert query(ours, hs.PoolHitPolicy.ALL_PAGES, 1) == (3, {kv: 6, swa: 3}, [1, 2, 3])
    assert query(ours, hs.PoolHitPolicy.TRAILING_PAGES, 2)[2] == [1, 2, 3, 6]

    # A pool that cannot be moved safely (pages dealt round-robin over ranks) fails closed;
    # the others work.
    sharded = interleave(sg, "page_first")
    ours.register_mem_host_pool_v2(sharded, indexer)
    assert "dealt round-robin" in ours.refused["indexer"]
    gone = hs.PoolTransfer(name=indexer, host_indices=kit.indices(sharded, [0]), keys=keys[:1])
    assert ours.batch_get_v2([gone]) == {indexer: [False]}
    assert ours.batch_exists_v2(keys, [gone]).kv_hit_pages == 0
    assert ours.batch_exists(keys) == 6


def test_tensor_api_round_trips_pages(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any
) -> None:
    backend = make_backend(interface_v1=0)
    pool = kit.mha("layer_first")
    backend.register_mem_pool_host(pool)
    size = pool.page_size
    pages = [pool.get_data_page(p * size, flat=True).clone() for p in (3, 9, 11)]
    assert backend.batch_set(["a", "b", "c"], pages)
    assert backend.set("d", pages[0]) and backend.exists("d") and not backend.exists("zz")
    assert backend.batch_exists(["a", "b", "c", "zz", "d"]) == 3  # interface_v1=0: the v0 pages
    dummies = [pool.get_dummy_flat_data_page() for _ in range(4)]
    got = backend.batch_get(["a", "b", "c", "zz"], dummies)
    assert got[3] is None
    for page, restored in zip(pages, got[:3], strict=True):
        assert same_tensors(restored.view(sg.torch.int16), page.view(sg.torch.int16))
    one = backend.get("b", pool.get_dummy_flat_data_page())
    assert same_tensors(one.view(sg.torch.int16), pages[1].view(sg.torch.int16))
    assert backend.get("zz", pool.get_dummy_flat_data_page()) is None
    # Another size is another object pool: stored, and restored only into that size.
    assert backend.set("e", sg.torch.arange(3, dtype=sg.torch.float32))
    assert backend.get("e", sg.torch.zeros(2)) is None
    assert backend.get("e", sg.torch.zeros(3)).tolist() == [0.0, 1.0, 2.0]
    assert backend.get("a", dummies[0], target_sizes=[1]) is None  # sizes that disagree: miss


def test_data_path_errors_become_shaped_misses(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any
) -> None:
    backend = make_backend()
    pool = kit.mha("page_head")
    backend.register_mem_pool_host(pool)
    keys = ["x", "y"]
    assert backend.batch_set_v1(keys, kit.indices(pool, [1])) == [False, False]  # too few
    misaligned = kit.indices(pool, [1, 2]) + 1
    assert backend.batch_get_v1(keys, misaligned) == [False, False]
    other = sg.hs.PoolName.SWA
    unknown = sg.hs.PoolTransfer(name=other, host_indices=kit.indices(pool, [1]), keys=["x"])
    assert backend.batch_set_v2([unknown]) == {other: [False]}
    assert backend.batch_set_v1(keys, kit.indices(pool, [1, 2])) == [True, True]
    backend.close()
    assert backend.batch_get_v1(keys, kit.indices(pool, [3, 4])) == [False, False]
    assert backend.batch_exists(keys) == 0


def test_random_failures_never_report_a_wrong_page(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE", "0.3")
    backend = make_backend()
    assert type(backend).__name__ == "HiCacheStorageFailureInjector"
    pool = kit.mha("page_first_direct", pages=64)
    backend.register_mem_pool_host(pool)
    size = pool.page_size
    # Keys are content hashes in SGLang: one key, one content, whatever page holds it.
    content = {f"key{i}": kit.page(pool, i) for i in range(16)}
    flat = {k: pool.get_data_page(i * size, flat=True).clone() for i, k in enumerate(content)}
    stored: set[str] = set()
    rng = random.Random(3)
    for _ in range(60):
        keys = rng.sample(sorted(content), rng.randint(1, 6))
        pages = rng.sample(range(16, pool.page_num), len(keys))
        if rng.random() < 0.5:
            for key, page in zip(keys, pages, strict=True):
                pool.set_from_flat_data_page(page * size, flat[key])
            done = backend.batch_set_v1(keys, kit.indices(pool, pages))
            stored.update(k for k, ok in zip(keys, done, strict=True) if ok)
            continue
        present = backend.batch_exists(keys)
        assert set(keys[:present]) <= stored
        done = backend.batch_get_v1(keys, kit.indices(pool, pages))
        assert len(done) == len(keys)
        for key, page, ok in zip(keys, pages, done, strict=True):
            if ok:
                assert key in stored
                assert same_tensors(kit.page(pool, page), content[key])
    assert stored, "the injector failed every call; raise the loop count"


def test_get_stats_reports_pipeline_counters(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any
) -> None:
    backend = make_backend({"enable_storage_metrics": True})
    pool = kit.mha("layer_first")
    backend.register_mem_pool_host(pool)
    backend.batch_set_v1(["s0", "s1"], kit.indices(pool, [0, 1]))
    backend.batch_get_v1(["s0", "s1"], kit.indices(pool, [2, 3]))
    stats = backend.get_stats()
    assert stats.prefetch_pgs == [2] and stats.backup_pgs == [2]
    assert len(stats.prefetch_bandwidth) == 1
    assert stats.kvcr_policy["pages_read"] == 2 and stats.kvcr_policy["pages_written"] == 2
    assert backend.get_stats().prefetch_pgs == []  # samples are drained, counters are not
    backend.clear()
    assert backend.batch_exists(["s0"]) == 0


def test_keys_are_namespaced_per_rank_and_geometry(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any
) -> None:
    def prefix(fields: dict[str, Any], layout: str = "page_first", mla: bool = False) -> str:
        backend = make_backend(fields)
        backend.register_mem_pool_host(kit.mla(layout) if mla else kit.mha(layout))
        return str(backend.pools["kv"].namespace.prefix)

    base = prefix({})
    assert prefix({}) == base
    assert prefix({"tp_rank": 1, "tp_size": 2}) != base
    assert prefix({"dp_rank": 1}) != base
    assert prefix({"pp_rank": 1, "pp_size": 2}) != base
    assert prefix({"attn_cp_rank": 1, "attn_cp_size": 2}) != base
    assert prefix({"model_name": "other"}) != base
    assert prefix({}, layout="page_head") != base
    mla = {"is_mla_model": True}
    assert prefix({**mla, "tp_rank": 1, "tp_size": 2}, mla=True) == prefix(mla, mla=True)


def test_a_pool_whose_buffer_disagrees_is_refused_alone(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, caplog: pytest.LogCaptureFixture
) -> None:
    backend = make_backend()
    good, bad = kit.mha("page_first"), kit.mha("page_first")
    bad.kv_buffer = bad.kv_buffer.transpose(2, 3)  # same bytes, not the layout it claims
    swa = sg.hs.PoolName.SWA
    with caplog.at_level(logging.ERROR, logger="kvcr_policy"):
        backend.register_mem_pool_host(good)
        backend.register_mem_host_pool_v2(bad, swa)
        backend.register_mem_host_pool_v2(bad, swa)  # refused once, not retried
    assert "buffer shape" in backend.refused["swa"]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.getMessage().count("fails closed") for r in errors] == [1]
    put = sg.hs.PoolTransfer(name=swa, host_indices=kit.indices(bad, [0]), keys=["a"])
    assert backend.batch_set_v2([put]) == {swa: [False]}
    assert backend.batch_set_v1(["a"], kit.indices(good, [0])) == [True]


def test_a_tier_larger_than_the_process_can_get_fails_the_start_with_its_message(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, tmp_path: Path
) -> None:
    """Faked: a 1 GiB host (this machine has more). No pool that misses for ever: the
    registration SGLang makes at start raises, with the flag's key as the origin."""
    host = FakeHost(tmp_path, total=GIB, available=GIB // 2)
    backend = make_backend(overrides={"placement.capacity_bytes": "2GiB"})
    pool = kit.mha("page_first")
    with use_roots(proc=host.proc, sys=host.sys), pytest.raises(TierMemoryError) as caught:
        backend.register_mem_pool_host(pool)
    origin = f"{EXTRA} ['overrides']['placement.capacity_bytes']"
    assert f"placement.capacity_bytes = 2GiB (from {origin})" in str(caught.value)
    assert "MemTotal is 1GiB" in str(caught.value) and not backend.pools


@pytest.mark.parametrize(
    ("pool", "reason"),
    [("interleave", "dealt round-robin over 2 ranks")],
)
def test_real_pools_that_cannot_be_kept_fail_closed_with_their_reason(
    sg: SimpleNamespace,
    kit: SimpleNamespace,
    make_backend: Any,
    caplog: pytest.LogCaptureFixture,
    pool: str,
    reason: str,
) -> None:
    """SGLang's own host pool classes, built on CPU: each refusal is logged with its reason,
    SGLang's "pools registered" call logs the ``refused (misses)`` line, the refused pool's
    pages miss and the KV pool keeps working."""
    refused = interleave(sg, "page_first")
    assert type(refused).__name__ == "PageInterleaveHostPool"
    backend = make_backend()
    good = kit.mha("page_first")
    swa = sg.hs.PoolName.SWA
    with caplog.at_level(logging.INFO, logger="kvcr_policy"):
        backend.register_mem_pool_host(good)
        backend.register_mem_host_pool_v2(good, sg.hs.PoolName.KV)
        backend.register_mem_host_pool_v2(refused, swa)
        backend.on_host_pools_registered()
    assert reason in backend.refused["swa"]
    lines = [r.getMessage() for r in caplog.records]
    assert any("fails closed (misses)" in line and reason in line for line in lines), lines
    summary = [line for line in lines if line.startswith("kvcr_policy pools: ")]
    assert len(summary) == 1
    assert summary[0].startswith(
        "kvcr_policy pools: kv (page_first, zero-copy); refused (misses): swa: "
    )
    assert reason in summary[0]
    put = sg.hs.PoolTransfer(name=swa, host_indices=kit.indices(good, [0]), keys=["a"])
    assert backend.batch_set_v2([put]) == {swa: [False]}
    assert backend.batch_set_v1(["a"], kit.indices(good, [0])) == [True]
    assert backend.batch_exists(["a"]) == 1


# ---- configuration precedence through SGLang's factory (docs/sglang.md, "Overriding from the
# environment"): extra_config overrides > KVCR_POLICY_* > the profile > schema defaults, and a
# profile named in extra_config wins over KVCR_POLICY_PROFILE.


def _start_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "kvcr_policy.integrations.sglang"]


def test_kvcr_policy_profile_selects_the_profile_without_extra_config(
    make_backend: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KVCR_POLICY_PROFILE", "throughput")
    with caplog.at_level(logging.INFO, logger="kvcr_policy"):
        backend = make_backend()
    assert backend.loaded.config.batching.read_batch_pages == 256
    assert backend.loaded.config.coalescing.strategy == "contiguous"
    first = _start_lines(caplog)[0]
    assert "throughput.toml (from env KVCR_POLICY_PROFILE)" in first


def test_a_profile_in_extra_config_wins_over_kvcr_policy_profile(
    make_backend: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KVCR_POLICY_PROFILE", "throughput")
    with caplog.at_level(logging.INFO, logger="kvcr_policy"):
        backend = make_backend(profile="default")
    assert backend.loaded.config.batching.read_batch_pages == 128
    assert backend.loaded.config.coalescing.strategy == "none"
    first = _start_lines(caplog)[0]
    assert "default.toml (from SGLang --hicache-storage-backend-extra-config" in first


def test_extra_config_overrides_win_over_the_environment_which_wins_over_the_profile(
    make_backend: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("KVCR_POLICY_BATCHING__READ_BATCH_PAGES", "512")
    monkeypatch.setenv("KVCR_POLICY_BATCHING__QUERY_BATCH_KEYS", "77")
    with caplog.at_level(logging.INFO, logger="kvcr_policy"):
        backend = make_backend(
            profile="throughput",
            overrides={"placement.capacity_bytes": "64MiB", "batching.read_batch_pages": 64},
        )
    batching = backend.loaded.config.batching
    assert (batching.read_batch_pages, batching.query_batch_keys) == (64, 77)
    assert batching.window_batches == 4  # the profile's, where nothing else speaks
    lines = _start_lines(caplog)
    key = "['overrides']['batching.read_batch_pages']"
    assert f"kvcr_policy: batching.read_batch_pages = 64 (from {EXTRA} {key})" in lines
    env = "env KVCR_POLICY_BATCHING__QUERY_BATCH_KEYS"
    assert f"kvcr_policy: batching.query_batch_keys = 77 (from {env})" in lines


def test_an_environment_typo_is_refused_through_sglangs_factory(
    make_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVCR_POLICY_BATCHING__READ_BACH_PAGES", "512")
    with pytest.raises(ConfigError) as caught:
        make_backend(profile="throughput")
    text = str(caught.value)
    assert "KVCR_POLICY_BATCHING__READ_BACH_PAGES" in text
    assert "did you mean KVCR_POLICY_BATCHING__READ_BATCH_PAGES" in text


@pytest.mark.parametrize("suffix", [".json", ".toml", ".yaml"])
def test_sglangs_at_file_form_builds_the_backend_and_origins_name_the_file(
    sg: SimpleNamespace,
    storage_config: Any,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    suffix: str,
) -> None:
    """``--hicache-storage-backend-extra-config @FILE``, read by SGLang's own parser."""
    import json

    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    from kvcr_policy.integrations.sglang.config import LOADER_KEYS

    wanted = {**LOADER_KEYS, "prefetch_threshold": 128, "profile": "throughput",
              "overrides": {"placement.capacity_bytes": "64MiB"}}  # fmt: skip
    path = tmp_path / f"sglang-extra{suffix}"
    if suffix == ".toml":
        head = "\n".join(f"{k} = {json.dumps(v)}" for k, v in wanted.items() if k != "overrides")
        path.write_text(head + '\n[overrides]\n"placement.capacity_bytes" = "64MiB"\n')
    else:  # YAML is a superset of JSON
        path.write_text(json.dumps(wanted))
    extra, threshold, *_ = HybridCacheController.parse_storage_backend_extra_config(f"@{path}")
    assert threshold == 128
    # SGLang publishes the flag's text with its server args; the backend reads it from there.
    memory = SimpleNamespace(hicache_storage_backend_extra_config=f"@{path}")
    monkeypatch.setattr("sglang.srt.runtime_context.get_memory", lambda: memory)
    with caplog.at_level(logging.INFO, logger="kvcr_policy"):
        backend = sg.StorageBackendFactory.create_backend("dynamic", storage_config(extra), None)
    try:
        assert backend.loaded.config.batching.read_batch_pages == 256
        key = "['overrides']['placement.capacity_bytes']"
        line = f"placement.capacity_bytes = 67108864 (from {EXTRA} @{path} {key})"
        assert line in caplog.text
    finally:
        backend.close()


@pytest.mark.parametrize(("restore", "expected"), [(1.0, 0), (1e15, 6)])
def test_batch_exists_reports_what_the_admission_gate_admits(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, restore: float, expected: int
) -> None:
    # Rates injected by configuration (no restore runs, so none is measured): a tier of
    # 1 byte/s is declined whole, one of 1 PB/s admitted whole, against 1e6 tokens/s.
    options = {"prefill_tokens_per_s": 1e6, "restore_bytes_per_s": restore}
    backend = make_backend(
        profile="gated", overrides={"admission.strategy": "gate", "admission.options": options}
    )
    pool = kit.mha("layer_first")
    backend.register_mem_pool_host(pool)
    keys = [f"gate-{i}" for i in range(6)]
    assert backend.batch_set_v1(keys, kit.indices(pool, list(range(6)))) == [True] * 6
    assert backend.batch_exists(keys) == expected
    hit = backend.batch_exists_v2(keys)
    assert hit.kv_hit_pages == expected
    reason = "restores_sooner" if expected else "computes_sooner"
    decision = "admitted" if expected else "declined"
    assert backend.pipeline.admission.counts == {(decision, reason): 12}


SLOW_TIER = {"prefill_tokens_per_s": 1e6, "restore_bytes_per_s": 1.0}  # injected: declined


def sent_to_the_tier(backend: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Keys per pipeline write, as the tier receives them (the backend's writes go through it)."""
    sent: list[int] = []
    write = backend.pipeline.set

    def recorded(keys: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(len(keys))
        return write(keys, *args, **kwargs)

    monkeypatch.setattr(backend.pipeline, "set", recorded)
    return sent


def test_pages_declined_at_lookup_are_computed_and_not_written_again(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = {"admission.strategy": "gate", "admission.options": SLOW_TIER}
    backend = make_backend(profile="gated", overrides=overrides)
    pool = kit.mha("layer_first")
    backend.register_mem_pool_host(pool)
    keys = [f"held-{i}" for i in range(6)]
    assert backend.batch_set_v1(keys, kit.indices(pool, list(range(6)))) == [True] * 6
    assert backend.batch_exists(keys) == 0  # in the tier, declined: SGLang computes them
    sent = sent_to_the_tier(backend, monkeypatch)
    # SGLang's backup writes the computed pages (other host pages) and two new ones.
    new = ["new-0", "new-1"]
    assert (
        backend.batch_set_v1(keys[:4] + new, kit.indices(pool, list(range(10, 16)))) == [True] * 6
    )
    assert sent == [2]  # the new ones only
    assert backend.declined.skipped == 4 and len(backend.declined) == 2  # held-4, held-5 left
    # The new pages went to the tier from their own host pages, byte for byte.
    assert backend.batch_get_v1(new, kit.indices(pool, [20, 21])) == [True, True]
    for stored, restored in ((14, 20), (15, 21)):
        assert same_tensors(kit.page(pool, restored), kit.page(pool, stored))
    # Skipped once: a page written again later (SGLang's next backup of it) goes through.
    assert backend.batch_set_v1(keys[:1], kit.indices(pool, [30])) == [True]
    assert sent == [2, 1] and backend.declined.skipped == 4
    # The v2 path of the KV pool leaves them out alike: nothing left to send.
    kv = sg.hs.PoolName.KV
    transfer = sg.hs.PoolTransfer(name=kv, host_indices=kit.indices(pool, [31, 32]), keys=keys[4:])
    assert backend.batch_set_v2([transfer]) == {kv: [True, True]}
    assert sent == [2, 1] and backend.declined.skipped == 6 and len(backend.declined) == 0
    # A lookup that admits notes nothing.
    assert backend.batch_exists([]) == 0 and len(backend.declined) == 0


def test_tensor_api_pages_declined_at_lookup_are_not_written_again(
    sg: SimpleNamespace, kit: SimpleNamespace, make_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = {"admission.strategy": "gate", "admission.options": SLOW_TIER}
    backend = make_backend(interface_v1=0, profile="gated", overrides=overrides)
    pool = kit.mha("layer_first")
    backend.register_mem_pool_host(pool)
    size = pool.page_size
    pages = [pool.get_data_page(p * size, flat=True).clone() for p in range(4)]
    assert backend.batch_set(["a", "b", "c"], pages[:3])
    assert backend.batch_exists(["a", "b", "c"]) == 0  # declined
    sent = sent_to_the_tier(backend, monkeypatch)
    assert backend.batch_set(["a", "b", "d"], [pages[0], pages[1], pages[3]])
    assert sent == [1] and backend.declined.skipped == 2
    got = backend.batch_get(["d"], [pool.get_dummy_flat_data_page()])
    assert same_tensors(got[0].view(sg.torch.int16), pages[3].view(sg.torch.int16))
