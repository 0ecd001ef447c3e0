"""Tests of kvcr_policy.pipeline: byte-exact round trips, batching, lifetime, bad input and
threads, with real bytes in small pools (the mover's coalescing, windows and fallback are in
``tests/test_mover.py``).

Pages are compared through the buffer's axes (``tests.strategies.page_slice``), never through
byte offsets, so the descriptor arithmetic is checked rather than repeated. Speed is never
asserted; the tier is kept small with ``placement.capacity_bytes``.
"""

from __future__ import annotations

import sys
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from kvcr_policy.backends.dram.store import Store
from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.config.loading import load_config
from kvcr_policy.errors import ClosedError, IndicesError, PoolError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.pipeline import Pipeline, build_pipeline
from kvcr_policy.registry import Registry
from tests.support.pipelines import (
    CAPACITY,
    LAYOUT_CASES,
    LAYOUT_IDS,
    Build,
    TrackingTransport,
    after_restore,
    build,
    geometry,
    indices_for,
    keep_switch_interval,
    kind_dtype,
    same_bytes,
    store_stats,
    stored_pool,
)
from tests.support.pools import (
    BUFFER_KINDS,
    P,
    copy_buffer,
    keys_of,
    page_bytes,
    page_slice,
    random_buffer,
    scramble,
    token_indices,
)

__all__ = ["build", "keep_switch_interval"]  # the rig's fixtures, used here


# ---- byte-exact round trips -----------------------------------------------------------------


@pytest.mark.parametrize("profile", ["default", "throughput"])
@pytest.mark.parametrize("kind", BUFFER_KINDS)
@pytest.mark.parametrize(("layout", "mla"), LAYOUT_CASES, ids=LAYOUT_IDS)
def test_round_trip_is_byte_exact_with_random_host_indices(
    build: Build, layout: str, mla: bool, kind: str, profile: str
) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{layout}/{mla}/{kind}/{profile}".encode()))
    geo = geometry(layout, mla=mla, dtype=kind_dtype(kind))
    buf = random_buffer(geo, rng, kind)
    original = copy_buffer(buf)
    n = 11
    src = rng.permutation(geo.pages)[:n]
    dst = rng.permutation(geo.pages)[:n]
    keys = keys_of("key-", n)
    # Batches of 3 pages: several batches, windows and (throughput) both copy threads at work.
    overrides = {"batching.read_batch_pages": 3, "transport.options.min_parallel_bytes": 0}
    pipeline = build(profile, overrides)
    pipeline.register_pool("kv", geo, buf)

    assert pipeline.set(keys, indices_for(kind, src)) == [True] * n
    assert same_bytes(buf, original), "a set must not modify the pool"
    scramble(buf, rng)
    before = copy_buffer(buf)
    assert pipeline.get(keys, indices_for(kind, dst)) == [True] * n

    assert same_bytes(buf, after_restore(before, original, geo, list(zip(src, dst, strict=True))))
    stats = pipeline.stats()
    assert (stats.pages_written, stats.pages_read) == (n, n)
    assert stats.bytes_written == stats.bytes_read == n * geo.page_bytes
    assert stats.fallbacks == {}


@pytest.mark.parametrize(("layout", "mla"), LAYOUT_CASES, ids=LAYOUT_IDS)
def test_round_trip_is_byte_exact_when_descriptors_are_split(
    build: Build, layout: str, mla: bool
) -> None:
    rng = np.random.default_rng(zlib.crc32(f"split/{layout}/{mla}".encode()))
    geo = geometry(layout, mla=mla)
    buf = random_buffer(geo, rng, "numpy-float16")
    original = copy_buffer(buf)
    src = rng.permutation(geo.pages)[:9]
    dst = rng.permutation(geo.pages)[:9]
    keys = keys_of("s", 9)
    # 48 bytes is smaller than every fragment here (64 to 384 bytes) and divides none evenly.
    pipeline = build("throughput", {"coalescing.split_bytes": 48})
    pipeline.register_pool("kv", geo, buf)
    assert pipeline.set(keys, token_indices(src, P)) == [True] * 9
    scramble(buf, rng)
    before = copy_buffer(buf)
    assert pipeline.get(keys, token_indices(dst, P)) == [True] * 9
    assert same_bytes(buf, after_restore(before, original, geo, list(zip(src, dst, strict=True))))
    stats = pipeline.stats()
    assert stats.descriptors_after > stats.descriptors_before


def test_keys_of_one_pool_are_not_in_another(build: Build) -> None:
    rng = np.random.default_rng(1)
    kv = geometry("page_first")
    swa = geometry("layer_first", mla=True, name="swa")
    kv_buf = random_buffer(kv, rng, "numpy-float16")
    swa_buf = random_buffer(swa, rng, "numpy-float16")
    kv_orig, swa_orig = copy_buffer(kv_buf), copy_buffer(swa_buf)
    pipeline = build()
    pipeline.register_pool("kv", kv, kv_buf)
    pipeline.register_pool("swa", swa, swa_buf)
    keys = keys_of("k", 4)

    results = pipeline.set_pools(
        {"kv": (keys, token_indices([0, 1, 2, 3], P)), "swa": (keys[:2], token_indices([5, 6], P))}
    )
    assert results == {"kv": [True] * 4, "swa": [True, True]}
    assert pipeline.exists(keys, "kv") == 4
    assert pipeline.exists(keys, "swa") == 2
    assert pipeline.exists_pools(keys, ["kv", "swa"]) == 2

    scramble(kv_buf, rng)
    scramble(swa_buf, rng)
    kv_before, swa_before = copy_buffer(kv_buf), copy_buffer(swa_buf)
    got = pipeline.get_pools(
        {
            "kv": (keys, token_indices([9, 8, 7, 6], P)),
            "swa": (keys, token_indices([1, 2, 3, 4], P)),
        }
    )
    assert got == {"kv": [True] * 4, "swa": [True, True, False, False]}
    assert same_bytes(
        kv_buf, after_restore(kv_before, kv_orig, kv, [(0, 9), (1, 8), (2, 7), (3, 6)])
    )
    assert same_bytes(swa_buf, after_restore(swa_before, swa_orig, swa, [(5, 1), (6, 2)]))


# ---- HiCache semantics: exists, get, set ----------------------------------------------------


def test_exists_counts_the_leading_run_in_query_batches(
    build: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline, *_, keys = stored_pool(build, overrides={"batching.query_batch_keys": 3}, n=7)
    asked: list[int] = []
    contains_prefix = Store.contains_prefix

    def spy(self: Store, batch: Sequence[str]) -> int:
        asked.append(len(batch))
        return contains_prefix(self, batch)

    monkeypatch.setattr(Store, "contains_prefix", spy)

    assert pipeline.exists(keys) == 7
    assert asked == [3, 3, 1]
    for miss_at in range(8):
        asked.clear()
        query = [*keys[:miss_at], "absent", *keys[miss_at:]]
        assert pipeline.exists(query) == miss_at
        # Batches after the one holding the miss are never asked.
        assert len(asked) == miss_at // 3 + 1
    asked.clear()
    assert pipeline.exists([]) == 0
    assert pipeline.exists(["absent", *keys]) == 0
    assert asked == [3]


def test_get_restores_only_the_leading_run_of_present_keys(build: Build) -> None:
    pipeline, geo, buf, original, keys = stored_pool(build)
    rng = np.random.default_rng(2)
    scramble(buf, rng)
    before = copy_buffer(buf)
    query = [keys[0], keys[1], "absent", keys[3], keys[4]]
    assert pipeline.get(query, token_indices([20, 21, 22, 23, 24], P)) == [True, True] + [False] * 3
    # keys[3] is present, but after the miss: its page must not be written.
    assert same_bytes(buf, after_restore(before, original, geo, [(0, 20), (1, 21)]))
    assert store_stats(pipeline)["claimed"] == 0
    assert pipeline.get(["absent"], token_indices([5], P)) == [False]
    assert pipeline.get([], token_indices([], P)) == []


def test_set_of_present_keys_succeeds_without_rewriting_them(build: Build) -> None:
    pipeline, geo, buf, original, keys = stored_pool(build, n=4)
    rng = np.random.default_rng(3)
    written = pipeline.stats().pages_written
    scramble(buf, rng)  # new bytes in the same pages: a rewrite would store them
    more = [keys[0], keys[1], "new0", keys[2]]
    assert pipeline.set(more, token_indices([0, 1, 10, 2], P)) == [True] * 4
    stats = pipeline.stats()
    assert stats.pages_written == written + 1
    assert store_stats(pipeline)["keys"] == 5

    fresh = copy_buffer(buf)
    scramble(buf, rng)
    before = copy_buffer(buf)
    assert pipeline.get([*keys, "new0"], token_indices([20, 21, 22, 23, 24], P)) == [True] * 5
    expected = after_restore(before, original, geo, [(0, 20), (1, 21), (2, 22), (3, 23)])
    expected = after_restore(expected, fresh, geo, [(10, 24)])
    assert same_bytes(buf, expected)


def test_a_key_repeated_in_one_set_reports_what_its_first_occurrence_did(build: Build) -> None:
    pipeline, _, _, _, keys = stored_pool(build, n=2)
    assert pipeline.set(["r0", "r0", keys[0], "r1"], token_indices([4, 5, 6, 7], P)) == [True] * 4
    assert pipeline.exists(["r0", keys[0], "r1"]) == 3


def test_a_set_larger_than_the_tier_stores_the_leading_run(build: Build) -> None:
    geo = geometry(pages=16)
    buf = random_buffer(geo, np.random.default_rng(4), "numpy-float16")
    pipeline = build(overrides={"placement.capacity_bytes": 5 * geo.page_bytes})
    pipeline.register_pool("kv", geo, buf)
    keys = keys_of("k", 7)
    assert pipeline.set(keys, token_indices(range(7), P)) == [True] * 5 + [False] * 2
    assert pipeline.exists(keys) == 5
    stats = store_stats(pipeline)
    assert (stats["capacity"], stats["keys"], stats["free"], stats["reserved"]) == (5, 5, 0, 0)


def test_least_recently_used_key_is_evicted_first(build: Build) -> None:
    geo = geometry(pages=16)
    rng = np.random.default_rng(5)
    buf = random_buffer(geo, rng, "numpy-float16")
    original = copy_buffer(buf)
    pipeline = build(overrides={"placement.capacity_bytes": 4 * geo.page_bytes})
    pipeline.register_pool("kv", geo, buf)
    keys = keys_of("k", 4)
    assert pipeline.set(keys, token_indices(range(4), P)) == [True] * 4
    assert pipeline.get([keys[0]], token_indices([8], P)) == [True]  # k0 is now the newest use
    assert pipeline.set(["k4"], token_indices([4], P)) == [True]
    assert [pipeline.exists([key]) for key in [*keys, "k4"]] == [1, 0, 1, 1, 1]
    assert store_stats(pipeline)["evictions"] == 1

    scramble(buf, rng)
    before = copy_buffer(buf)
    assert pipeline.get(["k4", "k0", "k3"], token_indices([9, 10, 11], P)) == [True] * 3
    assert same_bytes(buf, after_restore(before, original, geo, [(4, 9), (0, 10), (3, 11)]))


def test_delete_and_clear_forget_keys(build: Build) -> None:
    pipeline, *_, keys = stored_pool(build)
    assert pipeline.delete([keys[2], "absent"]) == 1
    assert pipeline.exists(keys) == 2
    assert pipeline.get(keys[2:3], token_indices([20], P)) == [False]
    pipeline.clear()
    assert pipeline.exists(keys) == 0
    stats = store_stats(pipeline)
    assert (stats["keys"], stats["free"]) == (0, stats["capacity"])


# ---- lifetime -----------------------------------------------------------------------------


def closed_calls(
    pipeline: Pipeline, geo: PoolGeometry, buf: object
) -> dict[str, Callable[[], Any]]:
    idx = token_indices([0], P)
    return {
        "exists": lambda: pipeline.exists(["k0"]),
        "get": lambda: pipeline.get(["k0"], idx),
        "set": lambda: pipeline.set(["z"], idx),
        "delete": lambda: pipeline.delete(["k0"]),
        "clear": lambda: pipeline.clear(),
        "register_pool": lambda: pipeline.register_pool("other", geo, buf),
        "get_pools": lambda: pipeline.get_pools({"kv": (["k0"], idx)}),
        "set_pools": lambda: pipeline.set_pools({"kv": (["z"], idx)}),
        "exists_pools": lambda: pipeline.exists_pools(["k0"], ["kv"]),
    }


def test_close_waits_for_in_flight_transfers(build: Build) -> None:
    geo = geometry(pages=32)
    transport = TrackingTransport({27}, geo)
    overrides = {"batching.read_batch_pages": 2}
    pipeline, _, buf, original, keys = stored_pool(
        build, overrides=overrides, n=8, transport=transport
    )
    transport.buffer = buf
    scramble(buf, np.random.default_rng(15))
    before = copy_buffer(buf)
    result: list[list[bool]] = []
    getter = threading.Thread(
        target=lambda: result.append(pipeline.get(keys, token_indices(range(20, 28), P)))
    )
    getter.start()
    try:
        assert transport.entered.wait(10)
        closer = threading.Thread(target=pipeline.close)
        closer.start()
        closer.join(0.3)
        assert closer.is_alive(), "close returned while a transfer was in flight"
        assert pipeline.state == "closing"
        with pytest.raises(ClosedError, match="closing"):
            pipeline.exists(keys)
        second = threading.Thread(target=pipeline.close)  # a second closer waits as well
        second.start()
        second.join(0.1)
        assert second.is_alive()
    finally:
        transport.gate.set()
    getter.join(10)
    closer.join(10)
    second.join(10)
    assert not (getter.is_alive() or closer.is_alive() or second.is_alive())
    assert result == [[True] * 8]
    pairs = [(i, 20 + i) for i in range(8)]
    assert same_bytes(buf, after_restore(before, original, geo, pairs))
    assert pipeline.state == "closed"


def test_calls_after_close_raise_and_close_is_idempotent(build: Build) -> None:
    pipeline, geo, buf, *_ = stored_pool(build, n=2)
    pipeline.close()
    pipeline.close()
    assert pipeline.state == "closed"
    for call, run in closed_calls(pipeline, geo, buf).items():
        with pytest.raises(ClosedError, match="closed") as info:
            run()
        assert call in str(info.value) or call.endswith("_pools"), str(info.value)
    for call in ("stats", "audit"):  # every call: the last counters stay in final_stats
        with pytest.raises(ClosedError, match=f"closed: {call}"):
            getattr(pipeline, call)()
    assert pipeline.final_stats is not None and pipeline.final_stats.pages_written == 2


def test_context_manager_closes(registry: Registry) -> None:
    overrides = {"placement.capacity_bytes": CAPACITY}
    loaded = load_config(environ={}, overrides=overrides, registry=registry)
    with build_pipeline(loaded) as pipeline:
        assert pipeline.state == "open"
    assert pipeline.state == "closed"


def test_thread_tuning_applies_while_open_and_is_restored_on_close(build: Build) -> None:
    sys.setswitchinterval(0.005)
    untouched = build()
    assert sys.getswitchinterval() == pytest.approx(0.005)
    pipeline = build("throughput")
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    pipeline.close()
    assert sys.getswitchinterval() == pytest.approx(0.005)
    untouched.close()
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_thread_tuning_is_restored_even_when_the_transport_fails_to_close(build: Build) -> None:
    class BrokenClose(MemoryTransport):
        def close(self) -> None:
            super().close()
            raise OSError("device lost")

    sys.setswitchinterval(0.005)
    pipeline = build("throughput", transport=BrokenClose())
    assert sys.getswitchinterval() == pytest.approx(0.0005)
    with pytest.raises(OSError, match="device lost"):
        pipeline.close()
    assert pipeline.state == "closed"
    assert sys.getswitchinterval() == pytest.approx(0.005)


# ---- bad input ----------------------------------------------------------------------------


BAD_INDICES: dict[str, tuple[Any, str]] = {
    "misaligned": (np.arange(1, 1 + 2 * P), "multiple of page_size"),
    "not consecutive": (np.array([0, 1, 3, 2, 4, 5, 6, 7]), "consecutive"),
    "out of range": (token_indices([2, 32], P), "0 <= index < 128"),
    "negative": (token_indices([-1, 2], P), "0 <= index"),
    "too few": (token_indices([2], P), "2 keys but indices for 1 pages"),
    "too many": (token_indices([2, 3, 4], P), "2 keys but indices for 3 pages"),
    "not whole pages": (np.arange(8, 8 + P + 1), "multiple of page_size"),
    "float": (token_indices([2, 3], P).astype(np.float64), "integer dtype"),
    "bool": (np.ones(2 * P, dtype=bool), "integer dtype"),
    "2-D": (token_indices([2, 3], P).reshape(2, P), "1-D"),
}


@pytest.mark.parametrize("call", ["get", "set"])
@pytest.mark.parametrize("case", list(BAD_INDICES))
def test_bad_indices_are_refused_and_corrupt_nothing(build: Build, call: str, case: str) -> None:
    pipeline, geo, buf, original, keys = stored_pool(build, n=4)
    indices, message = BAD_INDICES[case]
    tier_before = store_stats(pipeline)
    with pytest.raises(IndicesError, match=message) as info:
        getattr(pipeline, call)(["k0", "new"] if call == "set" else keys[:2], indices)
    assert "'kv'" in str(info.value)
    assert same_bytes(buf, original), "a refused call wrote into the pool"
    after = store_stats(pipeline)
    assert after == tier_before
    assert pipeline.exists([*keys, "new"]) == 4
    scramble(buf, np.random.default_rng(16))
    before = copy_buffer(buf)
    assert pipeline.get(keys, token_indices([20, 21, 22, 23], P)) == [True] * 4
    assert same_bytes(buf, after_restore(before, original, geo, [(i, 20 + i) for i in range(4)]))


def test_other_integer_index_types_are_accepted(build: Build) -> None:
    import torch

    pipeline, geo, buf, original, keys = stored_pool(build, n=3)
    forms = [
        token_indices([20, 21, 22], P).astype(np.int32),
        token_indices([20, 21, 22], P).astype(np.uint16),
        torch.from_numpy(token_indices([20, 21, 22], P)).to(torch.int32),
        token_indices([20, 21, 22], P).tolist(),
    ]
    for form in forms:
        scramble(buf, np.random.default_rng(17))
        before = copy_buffer(buf)
        assert pipeline.get(keys, form) == [True] * 3
        assert same_bytes(
            buf, after_restore(before, original, geo, [(i, 20 + i) for i in range(3)])
        )


def test_unknown_pool_is_a_clear_error(build: Build) -> None:
    pipeline, *_, keys = stored_pool(build, n=2)
    for run in (
        lambda: pipeline.get(keys, token_indices([5, 6], P), "mamba"),
        lambda: pipeline.set(keys, token_indices([5, 6], P), "mamba"),
        lambda: pipeline.exists(keys, "mamba"),
        lambda: pipeline.delete(keys, "mamba"),
    ):
        with pytest.raises(PoolError, match=r"no pool named 'mamba'.*registered: kv"):
            run()
    assert pipeline.exists(keys) == 2


def wrong_buffers(geo: PoolGeometry) -> dict[str, tuple[object, str]]:
    good = np.zeros(geo.shape, dtype=np.float16)
    return {
        "dtype": (np.zeros(geo.shape, dtype=np.float32), "dtype: expected float16, got float32"),
        "shape": (np.zeros((2, 3, geo.tokens + P, 2, 8), np.float16), "shape: expected"),
        "strides": (np.zeros((2, 3, 2, geo.tokens, 8), np.float16).swapaxes(2, 3), "strides"),
        "type": (good.tolist(), "type: expected a torch.Tensor or numpy.ndarray"),
        "device": (good, "device: expected cuda, got cpu"),
    }


@pytest.mark.parametrize("field", ["dtype", "shape", "strides", "type", "device"])
def test_a_refused_pool_names_the_field_and_other_pools_keep_working(
    build: Build, field: str
) -> None:
    pipeline, geo, buf, original, keys = stored_pool(build, n=3)
    bad_geo = geometry(name="bad", pages=32)
    if field == "device":
        bad_geo = replace(bad_geo, device="cuda")
    bad, message = wrong_buffers(bad_geo)[field]
    with pytest.raises(PoolError, match=message) as info:
        pipeline.register_pool("bad", bad_geo, bad)
    assert "'bad'" in str(info.value)
    assert "bad" in pipeline.refused and "bad" not in pipeline.pools
    with pytest.raises(PoolError, match="'bad' was refused"):
        pipeline.get(keys, token_indices([1, 2, 3], P), "bad")

    # The good pool is untouched, and a later good pool registers fine.
    assert pipeline.exists(keys) == 3
    assert pipeline.get(keys, token_indices([20, 21, 22], P)) == [True] * 3
    assert same_bytes(buf, after_restore(original, original, geo, [(i, 20 + i) for i in range(3)]))
    second = np.zeros(geo.shape, np.float16)
    pipeline.register_pool("bad", geo, second)
    assert "bad" not in pipeline.refused
    assert pipeline.set(["x"], token_indices([0], P), "bad") == [True]
    assert pipeline.exists(["x"]) == 0  # the key is in pool "bad" only


def test_a_pool_name_is_registered_once(build: Build) -> None:
    pipeline, geo, *_, keys = stored_pool(build, n=2)
    with pytest.raises(PoolError, match="already registered"):
        pipeline.register_pool("kv", geo, np.zeros(geo.shape, np.float16))
    assert "kv" not in pipeline.refused
    assert pipeline.get(keys, token_indices([9, 10], P)) == [True, True]


def test_a_pool_on_a_device_the_transport_cannot_move_is_refused(build: Build) -> None:
    class CudaOnly(MemoryTransport):
        name = "cuda-only"
        devices = frozenset({"cuda"})

    pipeline = build(transport=CudaOnly())
    geo = geometry()
    with pytest.raises(PoolError, match=r"lives on cpu, but transport 'cuda-only' moves only cuda"):
        pipeline.register_pool("kv", geo, np.zeros(geo.shape, np.float16))
    assert "kv" in pipeline.refused


@pytest.mark.cuda
def test_a_gpu_pool_on_the_cpu_transport_is_refused(build: Build) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    geo = replace(geometry(), device="cuda")
    pipeline = build()
    with pytest.raises(PoolError, match=r"lives on cuda:0, but transport 'cpu' moves only cpu"):
        pipeline.register_pool(
            "kv", geo, torch.zeros(geo.shape, dtype=torch.float16, device="cuda")
        )
    assert "kv" in pipeline.refused


def test_a_tier_smaller_than_a_page_is_refused_naming_its_origin(build: Build) -> None:
    geo = geometry()
    pipeline = build(overrides={"placement.capacity_bytes": geo.page_bytes - 1})
    with pytest.raises(PoolError, match=r"placement\.capacity_bytes.*holds no page"):
        pipeline.register_pool("kv", geo, np.zeros(geo.shape, np.float16))


# ---- threads ------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["default", "throughput"])
def test_four_threads_setting_and_getting_at_once_get_the_right_bytes(
    build: Build, profile: str
) -> None:
    threads, rounds, universe = 4, 60, 14
    geo = geometry(pages=threads * 4)
    buf = np.zeros(geo.shape, np.float16)
    shape = buf[page_slice(geo, 0)].shape
    content = {
        f"key{i}": np.random.default_rng(i).integers(0, 1 << 16, shape, np.uint16).view(np.float16)
        for i in range(universe)
    }
    # 12 slots: 4 threads x 2 keys claimed or reserved at most, so eviction always has room.
    overrides = {"placement.capacity_bytes": 12 * geo.page_bytes, "batching.read_batch_pages": 1}
    pipeline = build(profile, overrides)
    pipeline.register_pool("kv", geo, buf)
    errors: list[str] = []
    hits = [0] * threads
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        rng = np.random.default_rng(100 + t)
        own = [4 * t + i for i in range(4)]  # pages 0-1 to set from, 2-3 to get into
        start.wait()
        for _ in range(rounds):
            count = int(rng.integers(1, 3))
            keys = [f"key{i}" for i in rng.choice(universe, count, replace=False)]
            for key, page in zip(keys, own[:count], strict=True):
                buf[page_slice(geo, page)] = content[key]
            # A key another thread is writing right now is not present yet: False is fair.
            if len(pipeline.set(keys, token_indices(own[:count], P))) != count:
                errors.append(f"thread {t}: set {keys} gave a result of the wrong length")
            keys = [f"key{i}" for i in rng.choice(universe, count, replace=False)]
            for page in own[2:]:
                buf[page_slice(geo, page)] = 0
            result = pipeline.get(keys, token_indices(own[2 : 2 + count], P))
            leading = result.index(False) if False in result else count
            if any(result[leading:]):
                errors.append(f"thread {t}: get {keys} returned {result}")
            for key, page, ok in zip(keys, own[2 : 2 + count], result, strict=True):
                if ok:
                    hits[t] += 1
                    got = page_bytes(buf, geo, page)
                    if got != content[key].tobytes():
                        errors.append(f"thread {t}: {key} restored wrong bytes")

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert not any(worker.is_alive() for worker in workers)
    assert errors == []
    assert sum(hits) > 0
    stats = store_stats(pipeline)
    assert stats["keys"] <= stats["capacity"] == 12
    assert (stats["reserved"], stats["claimed"]) == (0, 0)
    assert stats["used"] + stats["free"] == stats["capacity"]
