"""count_batches counts what read_batches lists, for prefixes far past what may be listed."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kvcr_policy.builtin.batching import joined, ranges
from kvcr_policy.plan.batches import SAMPLE_PAGES, count_batches


class Ramp:
    """The example plugin's adaptive shape: a first batch, doubling up to ``size``."""

    def __init__(self, first: int, size: int) -> None:
        self.first, self.size = min(first, size), size

    def read_batches(self, n_pages: int) -> list[tuple[int, int]]:
        batches, start, size = [], 0, self.first
        while start < n_pages:
            batches.append((start, min(start + size, n_pages)))
            start, size = start + size, min(2 * size, self.size)
        return batches


class Fixed:
    def __init__(self, size: int) -> None:
        self.size = size

    def read_batches(self, n_pages: int) -> list[tuple[int, int]]:
        return ranges(n_pages, self.size)


class Growing:
    """Never settles: each batch one page larger than the last."""

    def read_batches(self, n_pages: int) -> list[tuple[int, int]]:
        batches, start, size = [], 0, 1
        while start < n_pages:
            batches.append((start, min(start + size, n_pages)))
            start, size = start + size, size + 1
        return batches


class Tenths:
    """Depends on the total: ten batches whatever the prefix."""

    def read_batches(self, n_pages: int) -> list[tuple[int, int]]:
        size = max(1, -(-n_pages // 10))
        return ranges(n_pages, size)


strategies = st.one_of(
    st.integers(1, 65536).map(Fixed),
    st.builds(Ramp, st.integers(1, 4096), st.integers(1, 65536)),
)


@settings(max_examples=50)  # each example may list 786,432 one-page batches
@given(strategies, st.integers(0, 3 * SAMPLE_PAGES))
def test_counts_equal_the_listed_batches(batching: Fixed | Ramp, pages: int) -> None:
    counted = count_batches(batching, pages)
    assert counted is not None
    listed = Counter(stop - start for start, stop in batching.read_batches(pages))
    assert counted.sizes == dict(listed)
    assert counted.total == sum(listed.values())


@settings(max_examples=50)
@given(strategies, st.integers(0, 3 * SAMPLE_PAGES), st.integers(1, 70000))
def test_joined_counts_equal_the_joined_listed_batches(
    batching: Fixed | Ramp, pages: int, least: int
) -> None:
    counted = count_batches(batching, pages, least)
    assert counted is not None
    listed = Counter(stop - start for start, stop in joined(batching.read_batches(pages), least))
    assert counted.sizes == dict(listed)


def test_a_huge_prefix_is_counted_without_a_list() -> None:
    counted = count_batches(Ramp(1, 256), 1 << 40)
    assert counted is not None
    assert sum(size * n for size, n in counted.sizes.items()) == 1 << 40
    assert counted.largest == 256


def test_strategies_that_never_settle_are_not_extrapolated() -> None:
    assert count_batches(Growing(), 2 * SAMPLE_PAGES) is None
    assert count_batches(Tenths(), 2 * SAMPLE_PAGES) is None
    assert count_batches(Tenths(), SAMPLE_PAGES) is not None  # listed: exact
