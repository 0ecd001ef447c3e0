"""The staging area (``backend.options.staging``) and the limit probe's own client, on a real
``mooncake_master`` and segment process over tcp loopback.

Staged pages must be byte-exact and the same objects as unstaged ones: a page stored through
the staging area reads back whole through either path, and the reverse, for any layout and
page list; a staging area too small for one page is refused with the option to change; what
it takes is reported. No speed is asserted (``kvcr-policy bench`` shows it).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcr_policy.errors import PoolError
from kvcr_policy.geometry import PoolGeometry
from tests.plugins.mooncake.mooncake_helpers import pipeline_on
from tests.strategies import geometries
from tests.support.pools import (
    fresh_keys,
    page_bytes,
    page_slice,
    pool_buffer,
    raw_bytes,
    token_indices,
)

pytestmark = [pytest.mark.mooncake, pytest.mark.slow]

#: A staging area of 8 KiB: room for a few of the drawn pages (at most 3 KiB each), so a
#: batch takes several calls and reuses its slots.
STAGING_BYTES = 8 << 10
_names = itertools.count()


@pytest.fixture(scope="module")
def pipelines(master: Any, segment: Any) -> Iterator[dict[str, Any]]:
    """A staged pipeline (``always``, a small area) and an unstaged one on the same store."""
    staged = pipeline_on(
        master, backend__options__staging="always", backend__options__staging_bytes=STAGING_BYTES
    )
    plain = pipeline_on(master)
    try:
        yield {"staged": staged, "plain": plain}
    finally:
        staged.close()
        plain.close()


def random_pool(geometry: PoolGeometry, seed: int) -> np.ndarray:
    buffer = np.empty(geometry.shape, dtype=geometry.dtype)
    raw = raw_bytes(buffer)
    raw[:] = np.random.default_rng(seed).integers(0, 256, raw.size, dtype=np.uint8)
    return buffer


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    geometry=geometries(max_pages=6).filter(lambda g: g.fragments_per_page > 1),
    data=st.data(),
)
def test_staged_pages_are_byte_exact_and_the_same_objects(
    pipelines: dict[str, Any], geometry: PoolGeometry, data: st.DataObject
) -> None:
    """Stored staged and read plain, stored plain and read staged, and staged both ways: every
    page arrives whole into other pages of the pool."""
    name = f"kv{next(_names)}"
    geometry = replace(geometry, name=name)
    buffer = random_pool(geometry, seed=geometry.pages)
    for side in pipelines.values():
        side.register_pool(name, geometry, buffer)
    order = data.draw(st.permutations(range(geometry.pages)))
    n = max(1, geometry.pages // 2)
    src, dst = order[:n], (order[n : 2 * n] or order[:n])
    expected = [page_bytes(buffer, geometry, p) for p in src]
    raw = raw_bytes(buffer)
    saved = raw.copy()
    for writer, reader in (("staged", "plain"), ("plain", "staged"), ("staged", "staged")):
        keys = fresh_keys(n)
        stored = pipelines[writer].set(keys, token_indices(src, geometry.page_size), name)
        assert stored == [True] * n
        for page in dst:
            buffer[page_slice(geometry, page)] = 0
        got = pipelines[reader].get(keys, token_indices(dst, geometry.page_size), name)
        assert got == [True] * n
        arrived = [page_bytes(buffer, geometry, page) for page in dst]
        assert arrived == expected, f"stored {writer}, read {reader}"
        raw[:] = saved


def test_the_staging_area_is_bounded_and_reported(pipelines: dict[str, Any]) -> None:
    geometry = PoolGeometry("kvb", "layer_first", 4, 2, 8, "float16", 4, 64)
    pipelines["staged"].register_pool("kvb", geometry, pool_buffer(geometry))
    area = pipelines["staged"].stats().pools["kvb"]["staging"]
    assert area["bytes"] <= STAGING_BYTES
    assert area["bytes"] == area["slots"] * area["slot_pages"] * geometry.page_bytes
    assert pipelines["staged"].stats().pools["kvb"]["calls"] == "staged"
    assert pipelines["staged"].stats().transport["staging"]["kvb"] == area


def test_a_staging_area_smaller_than_a_page_is_refused(master: Any) -> None:
    geometry = PoolGeometry("kv", "layer_first", 4, 2, 8, "float16", 4, 64)
    small = {"backend__options__staging": "always", "backend__options__staging_bytes": 100}
    expected = r"staging_bytes \(100 bytes\) holds no page of it \(1024 bytes\)"
    with pipeline_on(master, **small) as pipeline, pytest.raises(PoolError, match=expected):
        pipeline.register_pool("kv", geometry, pool_buffer(geometry))


def test_the_limit_probe_runs_on_a_client_of_its_own(master: Any, segment: Any) -> None:
    geometry = PoolGeometry("kv", "layer_first", 4, 2, 8, "float16", 4, 64)
    buffer = pool_buffer(geometry)
    with pipeline_on(master) as pipeline:
        pipeline.register_pool("kv", geometry, buffer)
        assert pipeline.stats().pools["kv"]["probe_client"] is None
        pipeline.probe(geometry.nbytes)
        pipeline.probe(geometry.nbytes)  # the stored probe is read again
        probe_client = pipeline.stats().pools["kv"]["probe_client"]
        assert probe_client not in (None, pipeline.stats().transport["hostname"])
        counters = pipeline.stats().pools["kv"]["counters"]
        assert not any(name.startswith(("get", "set")) for name in counters)
