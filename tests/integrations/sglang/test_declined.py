"""DeclinedPages: the keys a lookup declined are left out of a write once, reported stored;
bounded, and a write of nothing noted is passed through untouched. (The backend's own use,
with SGLang's classes, is in ``test_storage.py``.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.integrations.sglang.declined import DeclinedPages


class Tier:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[int]]] = []

    def write(self, keys: Sequence[str], indices: Any) -> list[bool]:
        self.calls.append((list(keys), [int(i) for i in indices]))
        return [True] * len(keys)


def test_nothing_noted_passes_the_write_itself() -> None:
    tier = Tier()
    assert DeclinedPages().skipping(["a"], tier.write) == tier.write


def test_noted_keys_are_left_out_once_with_their_token_rows() -> None:
    declined, tier = DeclinedPages(), Tier()
    declined.note(["b", "d"])
    write = declined.skipping(["a", "b", "c", "d"], tier.write)
    indices = np.arange(8)  # 2 tokens a page
    assert write(["ns:a", "ns:b", "ns:c", "ns:d"], indices) == [True] * 4
    assert tier.calls == [(["ns:a", "ns:c"], [0, 1, 4, 5])]
    assert declined.skipped == 2 and len(declined) == 0
    assert declined.skipping(["b"], tier.write) == tier.write  # forgotten once skipped


def test_a_write_of_noted_keys_only_sends_nothing() -> None:
    declined, tier = DeclinedPages(), Tier()
    declined.note(["x", "y"])
    assert declined.skipping(["y", "x"], tier.write)(["y", "x"], np.arange(4)) == [True, True]
    assert tier.calls == []


def test_the_oldest_keys_go_first_past_the_bound() -> None:
    declined = DeclinedPages(kept=3)
    declined.note(["a", "b", "c"])
    declined.note(["d", "a"])  # a noted again: now the newest
    assert len(declined) == 3
    assert declined.split(["a", "b", "c", "d"]) == [True, False, True, True]


@given(
    noted=st.sets(st.integers(0, 15), max_size=16),
    written=st.lists(st.integers(0, 15), min_size=1, max_size=16, unique=True),
)
def test_every_key_is_written_or_was_noted(noted: set[int], written: list[int]) -> None:
    declined, tier = DeclinedPages(), Tier()
    declined.note([f"k{i}" for i in sorted(noted)])
    keys = [f"k{i}" for i in written]
    indices = np.repeat(np.array(written), 4) * 4 + np.tile(np.arange(4), len(written))
    assert declined.skipping(keys, tier.write)(keys, indices) == [True] * len(keys)
    sent = [key for call in tier.calls for key in call[0]]
    assert sorted(sent + [k for k in keys if int(k[1:]) in noted]) == sorted(keys)
    for call_keys, rows in tier.calls:  # each key's own 4 token rows, in order
        assert rows == [int(k[1:]) * 4 + j for k in call_keys for j in range(4)]
