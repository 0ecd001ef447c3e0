"""Metrics of real restores, read over HTTP from /metrics with prometheus-client's parser.

Every test moves real bytes through a real pipeline (the DRAM tier, the cpu or memory
transport), scrapes the endpoint and compares the counters with what moved: the pipeline's own
stats, the lengths of the calls, and failures injected through the memory transport. Series are
told apart by the test's own profile label (see conftest.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcr_policy.backends.dram.transports.base import CopyBatch
from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.config.loading import load_config
from kvcr_policy.errors import BackendUnavailableError, CapacityError, PoolError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.observability.metrics import MISS_REASONS
from kvcr_policy.pipeline import Pipeline, build_pipeline
from kvcr_policy.registry import Registry
from tests.observability.scraping import Samples, value
from tests.support.pools import keys_of, token_indices

pytestmark = pytest.mark.usefixtures("clean_env")

P = 4
GEOMETRY = PoolGeometry("kv", "layer_first", 3, 2, 8, "float16", P, P * 64)
PAGE = GEOMETRY.page_bytes  # 768 bytes: 6 fragments of 128
PLANES = GEOMETRY.fragments_per_page

Build = Callable[..., Pipeline]


@pytest.fixture
def build(registry: Registry) -> Iterator[Build]:
    """``build(profile_path, overrides, transport=None)``: a pipeline with one ``kv`` pool."""
    made: list[Pipeline] = []

    def make(profile: Path, overrides: dict[str, Any] | None = None, transport: Any = None):
        loaded = load_config(
            profile,
            environ={},
            overrides={"placement.capacity_bytes": "1MiB", **(overrides or {})},
            registry=registry,
        )
        pipeline = build_pipeline(loaded, transport=transport)
        made.append(pipeline)
        buffer = np.random.default_rng(7).integers(0, 1 << 16, GEOMETRY.shape, dtype=np.uint16)
        pipeline.register_pool("kv", GEOMETRY, buffer.view(np.float16))
        return pipeline

    yield make
    for pipeline in made:
        pipeline.close()


def pages(start: int, n: int) -> np.ndarray:
    return token_indices(range(start, start + n), P)


def misses(samples: Samples, direction: str) -> dict[str, float]:
    return {
        reason: value(samples, "kvcr_policy_misses_total", direction=direction, reason=reason)
        for reason in MISS_REASONS
    }


def test_counters_match_the_bytes_moved(
    build: Build, unique_profile: Callable[..., Path], scrape: Callable[[str], Samples]
) -> None:
    # Batches of 8 pages, coalesced into one run per plane, cut at 256 bytes (2 fragments).
    profile = unique_profile(
        '[batching]\nread_batch_pages = 8\n[coalescing]\nstrategy = "contiguous"\n'
        "split_bytes = 256\n"
    )
    pipeline = build(profile)
    assert pipeline.set(keys_of("k", 20), pages(0, 20)) == [True] * 20
    assert pipeline.exists([*keys_of("k", 20), "nope"]) == 20
    got = pipeline.get([*keys_of("k", 12), "absent"], pages(30, 13))
    assert got == [True] * 12 + [False]
    stats = pipeline.stats()
    s = scrape(profile.stem)

    assert value(s, "kvcr_policy_bytes_total", direction="store") == 20 * PAGE
    assert value(s, "kvcr_policy_bytes_total", direction="restore") == 12 * PAGE
    assert value(s, "kvcr_policy_bytes_total") == stats.bytes_read + stats.bytes_written
    assert value(s, "kvcr_policy_pages_total", direction="restore") == stats.pages_read == 12
    # Store: batches of 8, 8, 4 pages; restore: 8, 4. One run per plane per batch, cut into
    # pieces of 2 fragments (a run of 8 pages is 8 fragments of 128 bytes = 4 pieces).
    assert value(s, "kvcr_policy_batches_total", direction="store") == 3
    assert value(s, "kvcr_policy_batches_total", direction="restore") == 2
    before = value(s, "kvcr_policy_descriptors_before_coalescing_total")
    assert before == stats.descriptors_before == (20 + 12) * PLANES
    assert value(s, "kvcr_policy_descriptors_after_coalescing_total") == 5 * PLANES
    after = value(s, "kvcr_policy_descriptors_after_split_total")
    assert after == stats.descriptors_after == PLANES * (4 + 4 + 2 + 4 + 2)
    assert value(s, "kvcr_policy_metadata_keys_queried_total") == 21
    assert value(s, "kvcr_policy_metadata_keys_hit_total") == 20
    for call in ("exists", "get", "set"):
        assert value(s, "kvcr_policy_call_duration_seconds_count", call=call) == 1
    assert value(s, "kvcr_policy_window_inflight_batches_count") == 5
    assert misses(s, "restore") == {**dict.fromkeys(MISS_REASONS, 0.0), "absent": 1.0}
    assert value(s, "kvcr_policy_tier_used_bytes") == 20 * PAGE
    assert value(s, "kvcr_policy_tier_capacity_bytes") == (1 << 20) // PAGE * PAGE


def test_levels_are_taken_back_when_the_pipeline_closes(
    build: Build, unique_profile: Callable[..., Path], scrape: Callable[[str], Samples]
) -> None:
    profile = unique_profile()
    first, second = build(profile), build(profile)
    first.set(keys_of("a", 4), pages(0, 4))
    second.set(keys_of("b", 6), pages(0, 6))
    slots = (1 << 20) // PAGE
    s = scrape(profile.stem)
    assert value(s, "kvcr_policy_tier_capacity_bytes") == 2 * slots * PAGE  # both pipelines
    assert value(s, "kvcr_policy_tier_used_bytes") == 10 * PAGE
    first.close()
    s = scrape(profile.stem)
    assert value(s, "kvcr_policy_tier_capacity_bytes") == slots * PAGE
    assert value(s, "kvcr_policy_tier_used_bytes") == 6 * PAGE
    second.close()
    s = scrape(profile.stem)
    levels = ("kvcr_policy_tier_used_bytes", "kvcr_policy_tier_capacity_bytes",
              "kvcr_policy_claims_outstanding")  # fmt: skip
    assert not [key for key in s if key[0] in levels]  # removed with the tier, not left at 0
    assert value(s, "kvcr_policy_pages_total", direction="store") == 10  # counters stay


def test_claims_outstanding_while_a_restore_runs(
    build: Build, unique_profile: Callable[..., Path], scrape: Callable[[str], Samples]
) -> None:
    profile = unique_profile("[batching]\nread_batch_pages = 4\n")
    pipeline = build(profile)
    pipeline.set(keys_of("k", 12), pages(0, 12))
    seen: list[float] = []

    def ready(n: int) -> None:  # runs inside the get, between batches
        seen.append(value(scrape(profile.stem), "kvcr_policy_claims_outstanding"))

    pipeline.get(keys_of("k", 12), pages(20, 12), on_ready=ready)
    assert seen == [12.0, 12.0, 12.0]
    assert value(scrape(profile.stem), "kvcr_policy_claims_outstanding") == 0


def test_evicted_and_claimed_misses(
    build: Build, unique_profile: Callable[..., Path], scrape: Callable[[str], Samples]
) -> None:
    profile = unique_profile()
    pipeline = build(profile, {"placement.capacity_bytes": 8 * PAGE})
    pipeline.set(keys_of("a", 8), pages(0, 8))
    pipeline.set(keys_of("b", 8), pages(8, 8))  # evicts every a
    assert pipeline.get(keys_of("a", 3), pages(40, 3)) == [False] * 3
    assert pipeline.get(["never"], pages(40, 1)) == [False]
    # One call of 12 keys where 8 slots exist: the last 4 find every slot held by this write.
    stored = pipeline.set(keys_of("c", 12), pages(16, 12))
    assert stored.count(True) == 8
    s = scrape(profile.stem)
    assert value(s, "kvcr_policy_evictions_total") == 16
    assert misses(s, "store") == {**dict.fromkeys(MISS_REASONS, 0.0), "claimed": 4.0}
    assert misses(s, "restore") == {**dict.fromkeys(MISS_REASONS, 0.0), "evicted": 3.0,
                                    "absent": 1.0}  # fmt: skip
    pipeline.delete(keys_of("c", 1))
    assert pipeline.get(keys_of("c", 1), pages(40, 1)) == [False]  # deleted: absent again
    assert misses(scrape(profile.stem), "restore")["absent"] == 2


class Switch:
    """A memory-transport fault that raises ``error`` while on."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.on = False

    def __call__(self, batch: CopyBatch) -> int | None:
        if self.on:
            raise self.error
        return None


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OSError("link down"), "transport_error"),
        (BackendUnavailableError("peer gone"), "backend_unavailable"),
    ],
)
def test_failed_batches_miss_for_their_reason(
    build: Build,
    unique_profile: Callable[..., Path],
    scrape: Callable[[str], Samples],
    error: Exception,
    reason: str,
) -> None:
    profile = unique_profile("[batching]\nread_batch_pages = 4\n")
    fault = Switch(error)
    pipeline = build(profile, transport=MemoryTransport(fault=fault))
    pipeline.set(keys_of("k", 10), pages(0, 10))
    fault.on = True
    assert pipeline.get(keys_of("k", 10), pages(20, 10)) == [False] * 10
    assert pipeline.set(keys_of("n", 6), pages(30, 6)) == [False] * 6
    s = scrape(profile.stem)
    # No window: all three batches of the read were in flight, each failed, and every page
    # was retried alone in vain; each page of both calls is a miss for the batch's reason.
    assert misses(s, "restore") == {**dict.fromkeys(MISS_REASONS, 0.0), reason: 10.0}
    assert misses(s, "store") == {**dict.fromkeys(MISS_REASONS, 0.0), reason: 6.0}
    assert value(s, "kvcr_policy_fallback_pages_total", direction="restore", reason=reason) == 10
    assert value(s, "kvcr_policy_fallback_pages_total", direction="store", reason=reason) == 6
    assert value(s, "kvcr_policy_pages_total", direction="restore") == 0


def test_a_refused_pool_misses_as_refused(
    build: Build, unique_profile: Callable[..., Path], scrape: Callable[[str], Samples]
) -> None:
    profile = unique_profile()
    pipeline = build(profile)
    wrong = np.zeros((2, 3, 8), dtype=np.float16)
    with pytest.raises(PoolError):
        pipeline.register_pool("mamba", GEOMETRY, wrong)
    with pytest.raises(PoolError, match="refused"):
        pipeline.get(keys_of("k", 5), pages(0, 5), pool="mamba")
    with pytest.raises(PoolError):
        pipeline.get(keys_of("k", 3), pages(0, 3), pool="no-such-pool")  # never a label
    s = scrape(profile.stem)
    assert value(s, "kvcr_policy_misses_total", pool="mamba", reason="pool_refused") == 5
    assert not [k for k in s if ("pool", "no-such-pool") in k[1]]


def test_audit_and_link_gauges(
    build: Build, unique_profile: Callable[..., Path], scrape: Callable[[str], Samples]
) -> None:
    profile = unique_profile(
        "[placement]\nprefault = true\n[observability]\naudit_placement = true\n"
        'link_probe_bytes = "16KiB"\n'
    )
    pipeline = build(profile)
    s = scrape(profile.stem)
    assert value(s, "kvcr_policy_link_limit_bytes_per_second") > 0
    audit = pipeline.audit()["kv"]
    assert value(s, "kvcr_policy_placement_huge_page_bytes") == audit["huge_page_bytes"]
    # The move_pages(2) sample is scaled to the region: its pages, wherever they are.
    numa = value(s, "kvcr_policy_placement_numa_pages")
    assert math.isclose(numa, audit["numa_total_pages"], rel_tol=1e-9)


def test_a_configured_link_limit_is_exported(
    build: Build, unique_profile: Callable[..., Path], scrape: Callable[[str], Samples]
) -> None:
    profile = unique_profile('[observability]\nlink_limit_gbps = "12.5GB/s"\n')
    build(profile)
    assert value(scrape(profile.stem), "kvcr_policy_link_limit_bytes_per_second") == 12.5e9


def test_a_restore_faster_than_the_limit_raises_it(
    build: Build, unique_profile: Callable[..., Path], scrape: Callable[[str], Samples]
) -> None:
    """A limit set too low (or a probe of one copy, which an overlapping restore beats) is
    raised to the fastest restore's speed, so the speed while restoring (bytes over the
    seconds of get calls) is never more than the limit."""
    profile = unique_profile('[observability]\nlink_limit_gbps = "1MB/s"\n')
    pipeline = build(profile)
    for n in (4, 16):
        pipeline.set(keys_of(f"r{n}", n), pages(0, n))
        assert pipeline.get(keys_of(f"r{n}", n), pages(0, n)) == [True] * n
        s = scrape(profile.stem)
        limit = value(s, "kvcr_policy_link_limit_bytes_per_second")
        restored = value(s, "kvcr_policy_bytes_total", direction="restore")
        seconds = value(s, "kvcr_policy_call_duration_seconds_sum", call="get")
        assert limit >= 1e6
        assert restored / seconds <= limit  # a mean speed above 1 MB/s raised the limit


def test_metrics_off_records_nothing(
    build: Build, unique_profile: Callable[..., Path], scrape: Callable[[str], Samples]
) -> None:
    profile = unique_profile("[observability]\nmetrics = false\n")
    pipeline = build(profile)
    pipeline.set(keys_of("k", 4), pages(0, 4))
    assert pipeline.get(keys_of("k", 4), pages(8, 4)) == [True] * 4
    assert scrape(profile.stem) == {}


def test_recording_does_not_grow_with_the_pages(
    build: Build, unique_profile: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counters are updated per call or per batch: as many updates for 60 pages as for 2."""
    from prometheus_client import metrics

    updates = [0]
    for kind, method in ((metrics.Counter, "inc"), (metrics.Histogram, "observe"),
                         (metrics.Gauge, "inc"), (metrics.Gauge, "dec")):  # fmt: skip
        original = getattr(kind, method)

        def counted(self: Any, *args: Any, _original: Any = original, **kw: Any) -> None:
            updates[0] += 1
            _original(self, *args, **kw)

        monkeypatch.setattr(kind, method, counted)
    profile = unique_profile("[batching]\nread_batch_pages = 128\n")
    pipeline = build(profile)
    counts = []
    for n, prefix in ((2, "s"), (60, "l")):
        pipeline.set(keys_of(prefix, n), pages(0, n))
        updates[0] = 0
        pipeline.get(keys_of(prefix, n), pages(0, n))
        counts.append(updates[0])
    assert counts[0] == counts[1] > 0


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(["get", "set", "delete"]), st.integers(0, 11), st.integers(1, 9)),
        min_size=1,
        max_size=12,
    )
)
def test_every_page_asked_for_is_moved_or_missed(
    build: Build,
    unique_profile: Callable[..., Path],
    scrape: Callable[[str], Samples],
    calls: list[tuple[str, int, int]],
) -> None:
    """Invariant: per direction, pages counted + misses counted = what the calls did not
    report as present; and the counters equal the pipeline's own stats."""
    profile = unique_profile("[batching]\nread_batch_pages = 4\n")
    pipeline = build(profile, {"placement.capacity_bytes": 8 * PAGE})
    asked = {"restore": 0, "store": 0}
    failed = {"restore": 0, "store": 0}
    for op, start, n in calls:
        names = [f"k{i}" for i in range(start, start + n)]
        if op == "delete":
            pipeline.delete(names)
            continue
        direction = "restore" if op == "get" else "store"
        asked[direction] += n
        try:
            result = (pipeline.get if op == "get" else pipeline.set)(names, pages(start, n))
        except CapacityError:  # every slot holds a key of this very set: nothing stored
            failed[direction] += n
            continue
        failed[direction] += result.count(False)
    stats = pipeline.stats()
    s = scrape(profile.stem)
    restored = value(s, "kvcr_policy_pages_total", direction="restore")
    assert restored == stats.pages_read
    assert value(s, "kvcr_policy_pages_total", direction="store") == stats.pages_written
    assert restored + sum(misses(s, "restore").values()) == asked["restore"]
    assert sum(misses(s, "store").values()) == failed["store"]
