"""Block keys: equal prefixes give equal keys, and a block's key names its whole prefix."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.integrations.vllm.keys import block_keys, namespace

BLOCK = 4
tokens = st.lists(st.integers(0, 2**31 - 1), min_size=0, max_size=40)


@given(tokens, tokens)
def test_keys_agree_exactly_as_far_as_whole_blocks_agree(a: list[int], b: list[int]) -> None:
    ka, kb = block_keys(a, BLOCK, "p:", 100), block_keys(b, BLOCK, "p:", 100)
    assert len(ka) == len(a) // BLOCK and len(kb) == len(b) // BLOCK
    for i in range(min(len(ka), len(kb))):
        same_prefix = a[: (i + 1) * BLOCK] == b[: (i + 1) * BLOCK]
        assert (ka[i] == kb[i]) == same_prefix


def test_keys_are_capped_and_namespaced() -> None:
    keys = block_keys(list(range(40)), BLOCK, "ns:", 3)
    assert len(keys) == 3 and all(k.startswith("ns:") for k in keys)


def test_the_namespace_keeps_mha_shards_apart_and_shares_mla() -> None:
    assert namespace("m", "auto", 32, 0, 2, False) != namespace("m", "auto", 32, 1, 2, False)
    assert namespace("m", "auto", 32, 0, 2, True) == namespace("m", "auto", 32, 1, 2, True)
    assert namespace("m", "auto", 32, 0, 1, False) != namespace("m", "fp8", 32, 0, 1, False)
