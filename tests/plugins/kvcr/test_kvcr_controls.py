"""Our controls drive KVCR: batching sets the size of every KVCR call, delivery windows bound
KVCR's operations in flight, thread tuning holds while the backend is open, coalescing and split
sizing are declared unsupported (``coalescing.on_unsupported`` decides), and a failed batch
falls back page by page, counting only pages that arrived. Sizes and counts are observed on the
KVCR instance itself."""

from __future__ import annotations

import logging
import sys
from typing import Any

import numpy as np
import pytest

from kvcr_policy.errors import ConfigError, UnsupportedError
from tests.plugins.kvcr.kvcr_helpers import kvcr_of, pool_tier, spy, stored
from tests.support.pools import P, fresh_keys, geometry, pages_of, pool_buffer, token_indices


def test_batching_sets_the_size_of_each_deliver_deposit_query_and_claim(kvcr_pipeline: Any) -> None:
    pipeline = kvcr_pipeline(batching__read_batch_pages=3, batching__query_batch_keys=5)
    geo = geometry()
    buffer = pool_buffer(geo)
    pipeline.register_pool("kv", geo, buffer)
    keys = fresh_keys(12)
    with spy(kvcr_of(pipeline)) as calls:
        assert pipeline.set(keys, token_indices(range(12), P)) == [True] * 12
        assert pipeline.exists(keys) == 12
        assert pipeline.get(keys, token_indices(range(20, 32), P)) == [True] * 12
    assert calls.sizes["deposit"] == [3, 3, 3, 3]
    # exists, then the read's leading run; then its claims, in metadata-query batches too.
    assert calls.sizes["query"] == [5, 5, 2] * 2
    assert calls.sizes["fetch"] == [5, 5, 2]
    assert calls.sizes["deliver"] == [3, 3, 3, 3]
    with spy(kvcr_of(pipeline)) as calls:  # a miss ends the run: nothing past it is claimed
        asked = [*keys[:6], "absent", *keys[6:]]
        assert pipeline.get(asked, token_indices(range(30, 43), P)) == [True] * 6 + [False] * 7
    assert calls.sizes["query"] == [5, 5]
    assert calls.sizes["fetch"] == [5, 1]
    assert calls.sizes["deliver"] == [3, 3]


WINDOWS = [
    ({"batching__window_batches": 2}, 2),
    ({"batching__window_bytes": 3 * geometry().page_bytes}, 3),
]


@pytest.mark.parametrize(("window", "most"), WINDOWS)
def test_delivery_windows_bound_kvcr_operations_in_flight(
    kvcr_pipeline: Any, window: dict[str, Any], most: int
) -> None:
    pipeline = kvcr_pipeline(batching__read_batch_pages=1, **window)
    geo, buffer, keys = stored(pipeline, n=12)
    view = pages_of(buffer, geo)
    expected = view[:, :12].copy()
    view[:, 20:32] = 0
    ready: list[int] = []
    with spy(kvcr_of(pipeline)) as calls:
        assert (
            pipeline.get(keys, token_indices(range(20, 32), P), on_ready=ready.append)
            == [True] * 12
        )
    assert ready == list(range(1, 13))  # delivered in order
    assert np.array_equal(view[:, 20:32], expected)
    assert 1 <= calls.peak <= most
    runner = pipeline.stats().pools["kv"]["runner"]
    assert 1 <= runner["peak_in_flight"] <= most + 1  # + the claim, started before any batch
    assert runner["in_flight"] == 0


def test_thread_tuning_holds_while_the_backend_is_open(kvcr_pipeline: Any) -> None:
    before = sys.getswitchinterval()
    pipeline = kvcr_pipeline(thread_tuning__switch_interval_s=0.0021)
    _, _, keys = stored(pipeline, n=4)
    seen: list[float] = []
    pipeline.get(
        keys,
        token_indices(range(10, 14), P),
        on_ready=lambda n: seen.append(sys.getswitchinterval()),
    )
    assert seen and all(abs(s - 0.0021) < 1e-9 for s in seen)
    pipeline.close()
    assert abs(sys.getswitchinterval() - before) < 1e-9


def test_coalescing_is_unsupported_and_on_unsupported_decides(
    kvcr_pipeline: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(UnsupportedError) as caught:
        kvcr_pipeline(profile="throughput", coalescing__on_unsupported="error")
    text = str(caught.value)
    assert "backend 'kvcr' cannot coalesce or split descriptors, as" in text
    assert "coalescing.strategy 'contiguous' (from override)" in text
    assert "coalescing.split_bytes 67108864 (from override)" in text
    assert "set coalescing.on_unsupported = 'fallback'" in text
    with pytest.raises(UnsupportedError, match=r"as coalescing\.split_bytes 1048576 \(from"):
        kvcr_pipeline(coalescing__split_bytes="1MiB", coalescing__on_unsupported="error")
    with caplog.at_level(logging.WARNING, logger="kvcr_policy.pipeline"):
        # Unstaged (the profile alone stages these small fragments: one element per page).
        pipeline = kvcr_pipeline(profile="throughput", backend__options__staging="never")
    assert "sending plain descriptors (coalescing.on_unsupported)" in caplog.text
    geo, buffer, keys = stored(pipeline, n=8)
    view = pages_of(buffer, geo)
    expected = view[:, :8].copy()
    assert pipeline.get(keys, token_indices(range(20, 28), P)) == [True] * 8
    assert np.array_equal(view[:, 20:28], expected)
    stats = pipeline.stats()
    # One element per fragment, as KVCR takes them: 8 pages x 6 fragments, each way.
    assert stats.descriptors_before == stats.descriptors_after == 2 * 8 * geo.fragments_per_page


def _fail_pages(monkeypatch: pytest.MonkeyPatch, elements: set[int]) -> None:
    """Every NIXL transfer that writes one of these pool elements fails (KVCR reports FAILED)."""
    from kvcr.progress import _KVCRProgress

    original = _KVCRProgress.submit_transfer

    def submit_transfer(self: Any, operation: str, local: Any, remote: Any, **kw: Any) -> Any:
        if any(getattr(r, "framework", False) and r.element_index in elements for r in remote):
            raise RuntimeError("injected NIXL failure")
        return original(self, operation, local, remote, **kw)

    monkeypatch.setattr(_KVCRProgress, "submit_transfer", submit_transfer)


def test_a_page_that_never_arrives_ends_the_run_and_only_arrived_pages_count(
    kvcr_pipeline: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline = kvcr_pipeline(batching__read_batch_pages=4, batching__window_batches=1)
    geo, buffer, keys = stored(pipeline, n=12)
    view = pages_of(buffer, geo)
    expected = view[:, :12].copy()
    view[:, 20:32] = 0
    # Destination page 25 (position 5): its first fragment is element 0 * pages + 25.
    _fail_pages(monkeypatch, {25})
    got = pipeline.get(keys, token_indices(range(20, 32), P))
    # The batch of pages 4-7 failed and was retried page by page: 6 and 7 arrived (SGLang uses
    # the leading run only), and no batch after it was issued.
    assert got == [True] * 5 + [False] + [True] * 2 + [False] * 4
    for page in (0, 1, 2, 3, 4, 6, 7):
        assert np.array_equal(view[:, 20 + page], expected[:, page])
    assert not view[:, 28:32].any()
    stats = pipeline.stats()
    assert stats.fallbacks == {"TransportError": 4}  # the batch of pages 4-7, page by page
    assert stats.pages_read == 7


@pytest.mark.parametrize(("overrides", "policy"), [
    ({}, "LRUPolicy"),  # the default, as upstream
    ({"eviction__strategy": "fifo"}, "FIFOPolicy"),
    ({"placement__eviction": "fifo"}, "FIFOPolicy"),  # the older spelling
])  # fmt: skip
def test_the_eviction_strategy_picks_kvcr_s_own_policy(
    kvcr_pipeline: Any, overrides: dict[str, str], policy: str
) -> None:
    pipeline = kvcr_pipeline(**overrides)
    pipeline.register_pool("kv", geometry(), pool_buffer(geometry()))
    assert type(pool_tier(pipeline, "kv").policy.inner).__name__ == policy


def test_an_eviction_strategy_kvcr_lacks_is_refused(kvcr_pipeline: Any) -> None:
    expected = r"eviction\.strategy \(from override\): .*eviction\.strategy is 's3fifo'"
    with pytest.raises(ConfigError, match=expected):  # a configuration that does not fit
        kvcr_pipeline(eviction__strategy="s3fifo")
