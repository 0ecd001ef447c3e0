"""The tensor-parallel shard one rank holds: KV heads divided as SGLang divides them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.bench import BenchError, BenchSetup
from kvcr_policy.bench.resolve import resolve
from kvcr_policy.bench.tp import describe_shard, shard_geometry, shard_heads
from kvcr_policy.geometry import preset


@pytest.mark.parametrize(
    ("heads", "ranks", "per_rank"),
    [(8, 1, 8), (8, 2, 4), (8, 4, 2), (8, 8, 1), (8, 16, 1), (8, 32, 1), (1, 4, 1), (6, 3, 2)],
)
def test_kv_heads_per_rank(heads: int, ranks: int, per_rank: int) -> None:
    assert shard_heads(heads, ranks) == per_rank


@pytest.mark.parametrize(("heads", "ranks"), [(8, 3), (8, 6), (8, 12), (6, 4)])
def test_heads_that_do_not_split_are_refused_with_the_choices(heads: int, ranks: int) -> None:
    with pytest.raises(BenchError, match=rf"--ranks {ranks}: .* {heads} KV heads") as err:
        shard_heads(heads, ranks)
    divisors = [n for n in range(1, heads + 1) if heads % n == 0]
    assert f"use --ranks {', '.join(map(str, divisors))}, or a multiple of {heads}" in str(
        err.value
    )


@given(heads=st.integers(1, 64), ranks=st.integers(1, 128))
def test_every_head_is_held_by_some_rank(heads: int, ranks: int) -> None:
    """Split or replicated, the ranks together hold every head, each rank the same count."""
    try:
        per_rank = shard_heads(heads, ranks)
    except BenchError:
        assert heads % ranks and ranks % heads  # refused only when neither divides the other
        return
    if ranks <= heads:
        assert per_rank * ranks == heads
    else:
        assert per_rank == 1 and ranks % heads == 0  # ranks // heads replicas of each head


def test_a_shard_is_its_share_of_the_pool_and_mla_is_whole() -> None:
    full = preset("qwen3-32b", layout="layer_first", tokens=115968)
    half = shard_geometry(full, 2)
    assert (half.heads, half.nbytes, half.pages) == (4, full.nbytes // 2, full.pages)
    assert half.fragments_per_page == full.fragments_per_page  # 64 KiB fragments, 128 a page
    assert half.fragment_bytes == 64 << 10
    mla = preset("qwen3-32b", layout="layer_first", tokens=4096, mla=True)
    assert shard_geometry(mla, 8) == mla  # every rank holds the whole latent


def test_resolve_measures_one_rank_shard() -> None:
    plan = resolve(BenchSetup(geometry="small", tokens=256, ranks=2))
    assert plan.measured.heads == 4 and plan.measured.name == "kv"
    assert describe_shard(plan) == {"kv_heads": 8, "kv_heads_per_rank": 4, "replicated": False}
    mla = resolve(BenchSetup(geometry="small", tokens=256, ranks=4, mla=True))
    assert describe_shard(mla)["replicated"] is True and mla.measured.heads == 1
    with pytest.raises(BenchError, match="--ranks: expected a positive count, got 0"):
        resolve(BenchSetup(geometry="small", tokens=256, ranks=0))
