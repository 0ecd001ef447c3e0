"""The key rule (kvcr_policy.keys) against a plain reference, on lists long enough to cross
the chunks its C passes work in, with the offending key anywhere."""

from __future__ import annotations

import string
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from kvcr_policy.errors import ArgumentError, UsageError
from kvcr_policy.keys import _CHUNK, MAX_KEY_BYTES, check_keys, key_part


def reference(keys: list[Any]) -> tuple[type[Exception], int] | None:
    """The rule written the slow way: the first bad key's error class and position."""
    for position, key in enumerate(keys):
        if not isinstance(key, str):
            return UsageError, position
    for position, key in enumerate(keys):
        try:
            size = len(key.encode("utf-8"))
        except UnicodeEncodeError:
            return ArgumentError, position
        if not 1 <= size <= MAX_KEY_BYTES:
            return ArgumentError, position
    return None


good = st.text(min_size=1, max_size=12)
bad = st.one_of(
    st.just(""),
    st.just("k" * (MAX_KEY_BYTES + 1)),
    st.just("é" * (MAX_KEY_BYTES // 2 + 1)),  # 1026 bytes in 513 characters
    st.just("\udc80"),
    st.integers(),
    st.none(),
    st.binary(max_size=3),
)


@example(n=_CHUNK + 2, where=_CHUNK + 1, key=1, second=True)  # wide key first, bad one later
@given(
    n=st.integers(1, 2 * _CHUNK + 5),
    where=st.integers(0, 10**6),
    key=st.one_of(good, bad),
    second=st.booleans(),
)
def test_the_rule_matches_its_reference(n: int, where: int, key: Any, second: bool) -> None:
    keys: list[Any] = [f"page-{i}" for i in range(n)]
    keys[where % n] = key
    if second:  # a harmless wide key in the first chunk: non-ASCII lists take the slow path
        keys[0 if where % n else n - 1] = "ключ"
    expected = reference(keys)
    if expected is None:
        assert check_keys(keys, "get") is keys
        return
    error, position = expected
    with pytest.raises(error, match=rf"get\(\): key at position {position} "):
        check_keys(keys, "get")


@given(st.text(), st.text())
@example("a:b", "a_b")
@example("kva@570680502306/x", "kva")
@example("\ud800", "\udfff")
def test_key_part_is_one_to_one_and_holds_no_separator(a: str, b: str) -> None:
    """What a backend puts in a composite key or a file name: two names never give one part,
    and no part holds a separator (a pool ``kva@<digest>/x`` once wrote pool kva's keys)."""
    assert (key_part(a) == key_part(b)) == (a == b)
    assert set(key_part(a)) <= set(string.ascii_letters + string.digits + "_.-~%")
    plain = "".join(c for c in a if c in string.ascii_letters + string.digits + "_.-~")
    assert key_part(plain) == plain  # the usual names (kv, v0.4096) are unchanged
