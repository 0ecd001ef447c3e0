"""The store's record of keys evicted lately: the newest ``size`` always known, memory bounded,
a discarded key forgotten (against a reference list of every key added).

The example Hypothesis found against an earlier model of this test, kept as a regression: a
discard does not bring back a key that newer adds had pushed out."""

from __future__ import annotations

import pytest
from hypothesis import example, given
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


@example(
    size=5,
    steps=[
        ("add", ["a", "b", "c", "d", "aa"]),
        ("add", ["a", "b", "c", "e", "aa"]),
        ("discard", "a"),
    ],
)
@given(size=st.integers(1, 16), steps=STEPS)
def test_the_newest_keys_are_known_and_the_record_stays_bounded(
    size: int, steps: list[tuple[str, object]]
) -> None:
    recent = RecentKeys(size)
    # Every key added since the last clear, oldest first; a discarded key's adds stay in the
    # history as ("gone", key): they still took their places among the newest (a discard
    # forgets the key, it does not bring back what was older), and none of them is expected.
    added: list[str | tuple[str, str]] = []
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
            added = [("gone", key) if key == arg else key for key in added]
            assert arg not in recent
        else:
            recent.clear()
            added = []
            assert len(recent) == 0
        newest: list[str] = []  # the last ``size`` distinct keys added, newest first
        expected: list[str] = []  # ... those not discarded since
        for item in reversed(added):
            name = item if isinstance(item, str) else item[1]
            if name not in newest:
                newest.append(name)
                if isinstance(item, str):
                    expected.append(name)
            if len(newest) == size:
                break
        assert all(key in recent for key in expected)
        present = {key for key in added if isinstance(key, str)}
        assert all(key in present for key in ("a", "b", "c") if key in recent)


def test_a_record_of_no_keys_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 key"):
        RecentKeys(0)
