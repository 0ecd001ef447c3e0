"""The one loop on the cpu target and the dram backend: real stores and restores, verified.

Speed is never asserted here: only that every figure is taken the documented way, and that
verification and store checks can fail.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvcr_policy.bench import BenchError, BenchSetup, run_bench
from kvcr_policy.bench.host_copy import HostCopy
from kvcr_policy.bench.targets import checksums
from kvcr_policy.pipeline import Pipeline

SMALL: dict[str, Any] = dict(
    geometry="small", layout="layer_first", tokens=256, repeat=2, exists_keys=1000
)


def test_both_profiles_in_both_orders_every_restore_verified() -> None:
    result = run_bench(BenchSetup("throughput", "default", **SMALL))
    data = result.to_dict()
    assert data["verified"] is True and (data["target"], data["backend"]) == ("cpu", "dram")
    assert data["bytes"] == 256 * 32 * 1024  # small: 32 KiB per token
    sides = [r.side for r in result.runs]
    assert sides == ["P", "Q", "Q", "P"] * 2  # P then Q, then Q then P, per repeat
    assert all(r.verified for r in result.runs)
    # Coalescing is on in throughput only: fewer descriptors reach its transport.
    assert data["descriptors"]["P"]["after"] < data["descriptors"]["P"]["before"]
    assert data["descriptors"]["Q"]["after"] == data["descriptors"]["Q"]["before"]
    assert data["exists_keys_per_s"] > 0 and data["baseline_exists_keys_per_s"] > 0
    assert data["profiles"]["Q"]["path"].endswith("default.toml")


def test_the_limit_is_one_probe_of_the_same_bytes_right_before_each_restore(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, int]] = []
    probe, get = Pipeline.probe, Pipeline.get

    def probing(self: Pipeline, nbytes: int, pool: str | None = None) -> None:
        calls.append(("probe", nbytes))
        probe(self, nbytes, pool)

    def getting(self: Pipeline, keys: Any, indices: Any, *args: Any, **kw: Any) -> list[bool]:
        calls.append(("get", len(keys)))
        return get(self, keys, indices, *args, **kw)

    monkeypatch.setattr(Pipeline, "probe", probing)
    monkeypatch.setattr(Pipeline, "get", getting)
    result = run_bench(BenchSetup("default", "default", **{**SMALL, "repeat": 1}))
    assert calls == [("probe", result.nbytes), ("get", result.pages)] * 4


def test_both_limits_right_before_each_restore_and_before_each_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, int]] = []
    probe, get, put, copy = Pipeline.probe, Pipeline.get, Pipeline.set, HostCopy.copy
    probe_store = Pipeline.probe_store

    def probing(self: Pipeline, nbytes: int, pool: str | None = None) -> None:
        calls.append(("probe", nbytes))
        probe(self, nbytes, pool)

    def probing_store(self: Pipeline, nbytes: int, pool: str | None = None) -> None:
        calls.append(("probe_store", nbytes))
        probe_store(self, nbytes, pool)

    def getting(self: Pipeline, keys: Any, indices: Any, *args: Any, **kw: Any) -> list[bool]:
        calls.append(("get", len(keys)))
        return get(self, keys, indices, *args, **kw)

    def setting(self: Pipeline, keys: Any, indices: Any, *args: Any, **kw: Any) -> list[bool]:
        calls.append(("set", len(keys)))
        return put(self, keys, indices, *args, **kw)

    def copying(self: HostCopy) -> None:
        calls.append(("host copy", self.nbytes))
        copy(self)

    monkeypatch.setattr(Pipeline, "probe", probing)
    monkeypatch.setattr(Pipeline, "probe_store", probing_store)
    monkeypatch.setattr(Pipeline, "get", getting)
    monkeypatch.setattr(Pipeline, "set", setting)
    monkeypatch.setattr(HostCopy, "copy", copying)
    result = run_bench(BenchSetup("default", "default", **{**SMALL, "repeat": 1}))
    n, pages = result.nbytes, result.pages
    # A first store per side fills its tier; then one store per side in each order, each
    # into the emptied tier: the figures are of these 4.
    # P's store limit (its move into its emptied tier) right before each of P's stores.
    p_store = [("host copy", n), ("probe_store", n), ("set", pages)]
    q_store = [("host copy", n), ("set", pages)]
    stores = p_store + q_store + (p_store + q_store + q_store + p_store) * 1
    restores = [("probe", n), ("host copy", n), ("get", pages)] * 4
    # The first host copy is the untimed one that faults the buffers in; the metadata
    # measurement's stores (1000 one-byte pages) come after the restores.
    assert calls[: 1 + len(stores) + len(restores)] == [("host copy", n), *stores, *restores]
    data = result.to_dict()
    assert data["stores_timed"] == {"P": 2, "Q": 2}
    assert all(r["host_copy_limit_gigabytes_per_s"] > 0 for r in data["runs"])
    assert data["store_host_copy_limit_gigabytes_per_s"] > 0
    assert data["host_copy_limit"].startswith("one contiguous copy of the same bytes")
    # The dram tier's store limit: its move of the same bytes into the emptied tier, P's
    # for both sides (as a restore's limit is P's).
    assert data["store_limit_gigabytes_per_s"] > 0 and data["store_ratio_to_limit"] > 0
    limit = result.store_limit_gbps["P"]
    assert result.store_ratio["Q"] == result.store_gbps["Q"] / limit
    assert data["store_limit"] == "one move of the same bytes, pool -> emptied tier " + (
        "(Pipeline.probe_store)"
    )


def test_a_plugins_backend_without_an_adapter_gets_both_limits_too() -> None:
    # The example plugin's dict backend, reached through --set on the dram adapter.
    setup = BenchSetup("default", "default", **SMALL, overrides={"backend.name": "dict"})
    data = run_bench(setup).to_dict()
    assert data["verified"] is True and data["transport"]["name"] == "dict"
    assert data["limit_gigabytes_per_s"] > 0 and data["host_copy_limit_gigabytes_per_s"] > 0
    assert data["ratio_to_host_copy_limit"] > 0


def test_scatter_stores_in_a_random_order_so_nothing_coalesces() -> None:
    setup: dict[str, Any] = dict(SMALL, layout="page_first", repeat=1)
    plain = run_bench(BenchSetup("throughput", "throughput", **setup)).to_dict()
    scattered = run_bench(BenchSetup("throughput", "throughput", **setup, scatter=True)).to_dict()
    assert scattered["verified"] is True and scattered["scatter"] is True
    assert scattered["descriptors"]["P"]["after"] > 4 * plain["descriptors"]["P"]["after"]


def test_a_restore_that_moved_nothing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every page "arrives" but no byte moves: only the checksums can tell.
    monkeypatch.setattr(Pipeline, "get", lambda self, keys, *a, **k: [True] * len(keys))
    result = run_bench(BenchSetup("default", "throughput", **{**SMALL, "repeat": 1}))
    assert result.verified is False
    assert [r.verified for r in result.runs] == [False] * 4


def test_a_store_that_kept_nothing_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Pipeline, "set", lambda self, keys, *a, **k: [False] * len(keys))
    with pytest.raises(BenchError, match="'throughput' did not store all 16 pages"):
        run_bench(BenchSetup("throughput", "default", **SMALL))


def test_checksums_see_one_flipped_byte_and_swapped_fragments() -> None:
    rng = np.random.default_rng(1)
    view = rng.integers(0, 256, size=(2, 4, 64), dtype=np.uint8)
    before = checksums(view)
    flipped = view.copy()
    flipped[1, 2, 17] ^= 1
    assert (checksums(flipped) != before).tolist() == [False, False, True, False]
    swapped = view[::-1].copy()  # K and V of every page exchanged
    assert (checksums(swapped) != before).all()
