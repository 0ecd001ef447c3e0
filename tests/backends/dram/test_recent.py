"""The store's record of keys evicted lately: the newest ``size`` always known, memory bounded,
a discarded key forgotten (against a reference list of every key added)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.backends.dram.recent import RecentKeys

KEYS = st.text(alphabet="abcdef", min_size=1, max_size=3)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(KEYS, max_size=12)),
        st.tuples(st.just("discard"), KEYS),
        st.tuples(st.just("clear"), st.none()),
    ),
    max_size=40,
)


@given(size=st.integers(1, 16), steps=STEPS)
def test_the_newest_keys_are_known_and_the_record_stays_bounded(
    size: int, steps: list[tuple[str, object]]
) -> None:
    recent = RecentKeys(size)
    added: list[str] = []  # every key added since the last clear, oldest first
    largest = 1  # the most distinct keys one add brought
    for op, arg in steps:
        if op == "add":
            batch = list(arg)  # type: ignore[call-overload]
            recent.add(batch)
            added.extend(batch)
            largest = max(len(set(batch)), largest)
            assert len(recent) <= 2 * size + largest
        elif op == "discard":
            recent.discard(arg)  # type: ignore[arg-type]
            added = [key for key in added if key != arg]
            assert arg not in recent
        else:
            recent.clear()
            added = []
            assert len(recent) == 0
        newest: list[str] = []
        for key in reversed(added):  # the last ``size`` distinct keys added
            if key not in newest:
                newest.append(key)
            if len(newest) == size:
                break
        assert all(key in recent for key in newest)
        assert all(key in added for key in ("a", "b", "c") if key in recent)


def test_a_record_of_no_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 key"):
        RecentKeys(0)
