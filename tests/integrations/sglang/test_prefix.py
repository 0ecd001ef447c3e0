"""usable_prefix agrees with HiCacheFile.batch_exists_v2's own loop, for any pool contents."""

from __future__ import annotations

from typing import Any

from hypothesis import given

from kvcr_policy.integrations.sglang.prefix import (
    ALL_PAGES,
    PoolQuery,
    usable_prefix,
)
from tests.strategies import prefix_queries


def _reference(
    kv_pages: int, pools: list[tuple[str, str, int]], held: dict[str, list[bool]]
) -> tuple[int, dict[str, int], list[int]]:
    """HiCacheFile.batch_exists_v2 (SGLang 0.5.23), rewritten over presence lists."""
    hit_count: dict[str, int] = {}
    restorable = list(range(1, kv_pages + 1))
    for name, policy, trailing_keys in pools:
        if not restorable:
            break
        if policy == ALL_PAGES:
            boundary = next((i for i in range(kv_pages) if not held[name][i]), kv_pages)
            pool_restorable = set(range(1, boundary + 1))
        else:
            trailing = max(1, trailing_keys)
            pool_restorable = {
                end
                for end in range(1, kv_pages + 1)
                if all(held[name][i] for i in range(max(0, end - trailing), end))
            }
            boundary = max(pool_restorable, default=0)
        if boundary:
            hit_count[name] = boundary
        restorable = [p for p in restorable if p in pool_restorable]
    return (restorable[-1] if restorable else 0), hit_count, restorable


@given(prefix_queries())
def test_usable_prefix_matches_hicache_file(
    case: tuple[int, list[tuple[str, str, int]], dict[str, list[bool]]],
) -> None:
    kv_pages, pools, held = case

    def leading(name: Any, n: int) -> int:
        return next((i for i in range(n) if not held[name][i]), n)

    def present(name: Any, n: int) -> list[bool]:
        return held[name][:n]

    got = usable_prefix(kv_pages, [PoolQuery(*p) for p in pools], leading, present)
    assert (got.pages, got.hits, got.ends) == _reference(kv_pages, pools, held)
    assert not got.skipped


def test_block_groups_never_gate_and_are_reported_skipped() -> None:
    got = usable_prefix(3, [PoolQuery("idx", "block_groups", 2)], lambda *_: 0, lambda *_: [])
    assert (got.pages, got.hits, got.ends) == (3, {}, [1, 2, 3])
    assert got.skipped == [PoolQuery("idx", "block_groups", 2)]
