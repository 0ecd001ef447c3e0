"""How pages become Mooncake objects (``ObjectPlan``), as properties over every layout.

An object's bytes, gathered from the pointers and sizes the batch calls receive, are exactly
the page's bytes as the buffer's axes define them (``tests.strategies.page_bytes``, which knows
nothing of byte offsets), in C order: so a page stored from one pool and read into any page of
another pool of the same layout arrives whole and in place. No Mooncake needed.
"""

from __future__ import annotations

import ctypes
import re
from importlib import metadata
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcr_policy.geometry import PoolGeometry
from tests.plugins.mooncake.mooncake_helpers import PLUGIN_DIST
from tests.strategies import geometries
from tests.support.installs import missing
from tests.support.pools import page_bytes, raw_bytes


@pytest.fixture(autouse=True)
def _plugin() -> None:
    try:
        metadata.distribution(PLUGIN_DIST)
    except metadata.PackageNotFoundError:
        missing(f"{PLUGIN_DIST} is not installed; pip install -e plugins/kvcr-policy-mooncake")


def layout_digest(geometry: PoolGeometry) -> str:
    from kvcr_policy_mooncake.objects import layout_digest as digest

    return digest(geometry)


def plan_of(geometry: PoolGeometry, buffer: object) -> object:
    from kvcr_policy_mooncake.objects import ObjectPlan

    address = raw_bytes(buffer).ctypes.data
    return ObjectPlan(geometry.name, geometry, address)


def gathered(pointers: object, sizes: object) -> bytes:
    if isinstance(pointers, int):
        return ctypes.string_at(pointers, int(sizes))  # type: ignore[call-overload]
    return b"".join(ctypes.string_at(p, n) for p, n in zip(pointers, sizes, strict=True))  # type: ignore[call-overload]


@given(geometries(max_pages=5), st.data())
def test_an_object_is_its_page_in_c_order(geometry: PoolGeometry, data: st.DataObject) -> None:
    buffer = np.empty(geometry.shape, dtype=geometry.dtype)
    raw = raw_bytes(buffer)
    raw[:] = np.random.default_rng(0).integers(0, 256, raw.size, dtype=np.uint8)
    plan = plan_of(geometry, buffer)
    pages = data.draw(st.lists(st.integers(0, geometry.pages - 1), max_size=6))
    pointers, sizes = plan.buffers(np.asarray(pages, dtype=np.int64))  # type: ignore[attr-defined]
    assert len(pointers) == len(sizes) == len(pages)
    assert plan.multi == (geometry.fragments_per_page > 1)  # type: ignore[attr-defined]
    for page, ptrs, lengths in zip(pages, pointers, sizes, strict=True):
        assert gathered(ptrs, lengths) == page_bytes(buffer, geometry, page)


@given(geometries(max_pages=4), st.data())
def test_pools_of_one_layout_share_keys_and_others_never_do(
    geometry: PoolGeometry, data: st.DataObject
) -> None:
    from kvcr_policy_mooncake.objects import ObjectPlan

    same = ObjectPlan("kv", geometry.with_tokens(geometry.page_size * 7), 0)
    assert ObjectPlan("kv", geometry, 0).keys(["a"]) == same.keys(["a"])
    other = data.draw(geometries(max_pages=4))
    fields = ("layout", "layers", "heads", "head_dim", "dtype", "page_size", "mla")
    if any(getattr(other, f) != getattr(geometry, f) for f in fields):
        assert ObjectPlan("kv", other, 0).keys(["a"]) != same.keys(["a"])
    probe = same.probe_key("host:1", 10, 0)
    assert not probe.startswith(same.keys([""])[0])  # a probe never collides with a page key


_NAMES = st.text(alphabet=st.sampled_from("ab@/#%.:-~\x00é"), min_size=1, max_size=8)


@given(geometries(max_pages=2), _NAMES, _NAMES, _NAMES, _NAMES, st.data())
def test_no_key_of_one_pool_or_tenant_is_a_key_of_another(
    geometry: PoolGeometry, name: str, other: str, tenant: str, tenant2: str, data: Any
) -> None:
    """Pool names and tenants holding the separators (red team 2026-12-c, C3: a pool named
    ``kva@<digest>/x`` wrote keys of pool ``kva``); the pattern ``clear()`` removes by matches
    its own pool's objects only."""
    from kvcr_policy_mooncake.objects import ObjectPlan

    layout = data.draw(geometries(max_pages=2))
    first = ObjectPlan(name, geometry, 0, tenant)
    second = ObjectPlan(other, layout, 0, tenant2)
    key, key2 = data.draw(_NAMES), data.draw(_NAMES)
    same = first.namespace == second.namespace
    assert same == (
        (name, tenant, layout_digest(geometry)) == (other, tenant2, layout_digest(layout))
    )
    if not same:
        assert first.keys([key]) != second.keys([key2])
        assert re.search(first.pattern, second.keys([key2])[0]) is None
        assert re.search(first.pattern, second.probe_key("h:1", 8, 0)) is None
    assert re.search(first.pattern, first.keys([key])[0])
    assert re.search(first.pattern, first.probe_key("h:1", 8, 0))
    assert ObjectPlan("kv", geometry, 0).namespace == f"kv@{layout_digest(geometry)}"
    assert ObjectPlan("kv", geometry, 0, "default") == ObjectPlan("kv", geometry, 0)
