"""DeclinedKeys: the keys a lookup declined are left out of a write to their pool once,
reported stored; bounded, and a write of nothing noted is passed through untouched. The
admission's own noting is checked against a plain reference; the engines' use of it is in
``tests/integrations/sglang/test_storage.py`` and ``tests/integrations/vllm/test_scheduler.py``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.admission import AdmissionDesk
from kvcr_policy.declined import DeclinedKeys
from kvcr_policy.strategies import Admission

POOL = "kv"


class Tier:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[int]]] = []

    def write(self, keys: Sequence[str], indices: Any) -> list[bool]:
        self.calls.append((list(keys), [int(i) for i in indices]))
        return [True] * len(keys)


def test_nothing_noted_passes_the_write_itself() -> None:
    tier = Tier()
    assert DeclinedKeys().skipping(POOL, ["a"], tier.write) == tier.write


def test_noted_keys_are_left_out_once_with_their_token_rows() -> None:
    declined, tier = DeclinedKeys(), Tier()
    declined.note([POOL], ["b", "d"])
    write = declined.skipping(POOL, ["a", "b", "c", "d"], tier.write)
    indices = np.arange(8)  # 2 tokens a page
    assert write(["ns:a", "ns:b", "ns:c", "ns:d"], indices) == [True] * 4
    assert tier.calls == [(["ns:a", "ns:c"], [0, 1, 4, 5])]
    assert declined.skipped == 2 and len(declined) == 0
    assert declined.skipping(POOL, ["b"], tier.write) == tier.write  # forgotten once skipped


def test_a_write_of_noted_keys_only_sends_nothing() -> None:
    declined, tier = DeclinedKeys(), Tier()
    declined.note([POOL], ["x", "y"])
    write = declined.skipping(POOL, ["y", "x"], tier.write)
    assert write(["y", "x"], np.arange(4)) == [True, True]
    assert tier.calls == []


def test_the_oldest_keys_go_first_past_the_bound() -> None:
    declined = DeclinedKeys(kept=3)
    declined.note([POOL], ["a", "b", "c"])
    declined.note([POOL], ["d", "a"])  # a noted again: now the newest
    assert len(declined) == 3
    assert declined.split(POOL, ["a", "b", "c", "d"]) == [True, False, True, True]


def test_a_key_declined_for_one_pool_is_written_to_another() -> None:
    declined = DeclinedKeys()
    declined.note(["kv", "idx"], ["a"])
    assert declined.split("other", ["a"]) is None
    assert declined.split("idx", ["a"]) == [True] and len(declined) == 1
    assert declined.split("kv", ["a"]) == [True] and len(declined) == 0


@given(
    noted=st.sets(st.integers(0, 15), max_size=16),
    written=st.lists(st.integers(0, 15), min_size=1, max_size=16, unique=True),
)
def test_every_key_is_written_or_was_noted(noted: set[int], written: list[int]) -> None:
    declined, tier = DeclinedKeys(), Tier()
    declined.note([POOL], [f"k{i}" for i in sorted(noted)])
    keys = [f"k{i}" for i in written]
    indices = np.repeat(np.array(written), 4) * 4 + np.tile(np.arange(4), len(written))
    assert declined.skipping(POOL, keys, tier.write)(keys, indices) == [True] * len(keys)
    sent = [key for call in tier.calls for key in call[0]]
    assert sorted(sent + [k for k in keys if int(k[1:]) in noted]) == sorted(keys)
    for call_keys, rows in tier.calls:  # each key's own 4 token rows, in order
        assert rows == [int(k[1:]) * 4 + j for k in call_keys for j in range(4)]


class Fixed:
    """An admission strategy that admits the first ``pages`` present pages, whatever the
    figures (the decision is the test's, not this machine's speed)."""

    def __init__(self) -> None:
        self.pages = 0

    def admit(self, found: int, page_tokens: int, page_bytes: int, outlook: Any) -> Admission:
        return Admission(min(self.pages, found), "fixed", "fixed")


KEYS = st.integers(0, 11).map(lambda i: f"k{i}")
LOOKUP = st.tuples(
    st.just("lookup"), st.sampled_from(["kv", "idx"]), st.lists(KEYS, max_size=8, unique=True),
    st.integers(0, 8), st.integers(0, 8),
)  # fmt: skip
WRITE = st.tuples(
    st.just("write"), st.sampled_from(["kv", "idx"]), st.lists(KEYS, max_size=8, unique=True),
    st.just(0), st.just(0),
)  # fmt: skip


@given(ops=st.lists(st.one_of(LOOKUP, WRITE), max_size=30), kept=st.integers(1, 12))
def test_declined_keys_are_never_written_and_admitted_or_unknown_ones_always_are(
    ops: list[tuple[str, str, list[str], int, int]], kept: int
) -> None:
    """Lookups through the admission and writes of any keys, against a plain reference: a
    write leaves out exactly the keys a lookup of that pool declined since they were last
    written (while kept, the newest ``kept``), and writes every key admitted or never
    declined; the keys kept never exceed ``kept``."""
    strategy = Fixed()
    desk = AdmissionDesk(strategy, clock=lambda: 0.0)
    desk.declined = DeclinedKeys(kept)
    reference: list[tuple[str, str]] = []  # declined (pool, key), the oldest first
    for op, pool, keys, found, admitted in ops:
        if op == "lookup":
            found, strategy.pages = min(found, len(keys)), admitted
            pages = desk.decide(pool, found, 16, 1024, None, keys)
            assert pages == min(admitted, found)
            for key in keys[pages:found]:
                if (pool, key) in reference:
                    reference.remove((pool, key))
                reference.append((pool, key))
            del reference[: max(len(reference) - kept, 0)]
        else:
            noted = desk.declined.split(pool, keys) or [False] * len(keys)
            expected = [(pool, key) in reference for key in keys]
            assert noted == expected  # declined: left out; admitted or unknown: written
            reference = [named for named in reference if named[1] not in keys or named[0] != pool]
        assert len(desk.declined) == len(reference) <= kept


def test_a_pipeline_lookup_notes_its_declined_keys_for_every_pool_it_was_for() -> None:
    strategy = Fixed()
    strategy.pages = 1
    desk = AdmissionDesk(strategy)
    assert desk.decide("kv", 3, 16, 1024, None, ["a", "b", "c", "d"], ["kv", "idx"]) == 1
    assert desk.declined.split("idx", ["a", "b", "c", "d"]) == [False, True, True, False]
    assert desk.declined.split("kv", ["c"]) == [True]
    assert desk.decide("kv", 3, 16, 1024, None) == 1 and len(desk.declined) == 1  # no keys
