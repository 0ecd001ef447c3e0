"""The usable prefix of a v2 existence query: how many KV pages every pool can restore with.

Mirrors ``HiCacheFile.batch_exists_v2`` of SGLang 0.5.23 (``mem_cache/hicache_storage.py``),
whose result the v2 callers (``HybridCacheController._storage_hit_query``) rely on: a prefix of
``end`` KV pages is restorable when every pool agrees; the answer is the longest such prefix.

- ``all_pages``: the pool holds each of pages ``[0, end)``.
- ``trailing_pages``: the pool holds the last ``trailing`` pages before ``end`` (Mamba and SWA
  state only cover the tail of a prefix), so restorable ends need not be consecutive.

Other policies (``block_groups``) never gate the KV hit; they are returned as skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any, NamedTuple

__all__ = ["ALL_PAGES", "TRAILING_PAGES", "PoolQuery", "Prefix", "usable_prefix"]

ALL_PAGES = "all_pages"
TRAILING_PAGES = "trailing_pages"


class PoolQuery(NamedTuple):
    """One pool of the query: its name as the caller gave it, hit policy and trailing window."""

    name: Any
    policy: str
    trailing: int = 1


class Prefix(NamedTuple):
    """``pages`` usable; ``hits`` per pool (only those with a nonzero boundary); ``ends``."""

    pages: int
    hits: dict[Any, int]
    ends: list[int]
    skipped: list[PoolQuery]


def usable_prefix(
    kv_pages: int,
    pools: Sequence[PoolQuery],
    leading: Callable[[Any, int], int],
    present: Callable[[Any, int], Sequence[bool]],
) -> Prefix:
    """Fold ``pools`` over the ``kv_pages`` KV pages present from the start.

    ``leading(name, n)``: how many of the first ``n`` pages pool ``name`` holds from the start;
    ``present(name, n)``: whether it holds each of the first ``n``. Pools are asked in order and
    not at all once nothing is restorable, as HiCacheFile does.
    """
    ends = list(range(1, kv_pages + 1))
    hits: dict[Any, int] = {}
    skipped: list[PoolQuery] = []
    for pool in pools:
        if not ends:
            break
        if pool.policy == ALL_PAGES:
            boundary = leading(pool.name, kv_pages)
            allowed = set(range(1, boundary + 1))
        elif pool.policy == TRAILING_PAGES:
            window = max(1, pool.trailing)
            held = [0, *accumulate(int(bool(x)) for x in present(pool.name, kv_pages))]
            allowed = {
                end
                for end in range(1, kv_pages + 1)
                if held[end] - held[max(0, end - window)] == min(end, window)
            }
            boundary = max(allowed, default=0)
        else:
            skipped.append(pool)
            continue
        if boundary:
            hits[pool.name] = boundary
        ends = [end for end in ends if end in allowed]
    return Prefix(ends[-1] if ends else 0, hits, ends, skipped)
