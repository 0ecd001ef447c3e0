"""KVCR pool names: one per pipeline pool, never a colon (KVCR refuses one) nor a '/' (the name
also names the pool's G3 files)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st


@given(st.text(min_size=1), st.text(min_size=1))
@example("a:b", "a_b")  # both were KVCR pool "a_b", sharing its G3 files
@example("../x", "..%2Fx")
def test_kvcr_pool_names_are_one_per_pool_and_safe_as_file_names(a: str, b: str) -> None:
    from kvcr_policy_kvcr.layout import kvcr_pool_name

    assert (kvcr_pool_name(a) == kvcr_pool_name(b)) == (a == b)
    name = kvcr_pool_name(a)
    assert ":" not in name and "/" not in name and name
    g3 = Path("/data/g3").with_name(f"g3.{name}")  # as the backend names a pool's G3 file
    assert g3.parent == Path("/data")
    assert kvcr_pool_name("kv") == "kv"
