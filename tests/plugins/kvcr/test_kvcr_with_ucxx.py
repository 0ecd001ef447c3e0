"""NIXL bundles its own UCX; ucxx (the peer tier) loads another. Both in one process, both
moving bytes at the same time, neither breaks the other (the whole test suite also runs them in
one process, in turn)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kvcr_policy import build_pipeline, load_config
from tests.support.installs import missing
from tests.support.pools import P, fresh_keys, geometry, pages_of, pool_buffer, token_indices

pytestmark = pytest.mark.ucx


@pytest.fixture
def peer() -> Iterator[Any]:
    try:
        import ucxx  # noqa: F401
    except Exception as err:
        missing(f"ucxx cannot be imported ({err}); pip install torch==2.13.0 -e '.[ucx]'")
    from kvcr_policy.backends.peer.process import PeerProcess

    server = PeerProcess({"transport.name": "ucx", "placement.capacity_bytes": "4MiB"})
    yield server
    assert server.stop() == 0


def _round_trips(pipeline: Any, rounds: int, seed: int) -> None:
    geo = geometry()
    buffer = pool_buffer(geo, seed)
    pipeline.register_pool("kv", geo, buffer)
    view = pages_of(buffer, geo)
    for _ in range(rounds):
        keys = fresh_keys(8)
        assert pipeline.set(keys, token_indices(range(8), P)) == [True] * 8
        view[:, 20:28] = 0
        assert pipeline.get(keys, token_indices(range(20, 28), P)) == [True] * 8
        assert np.array_equal(view[:, 20:28], view[:, :8])


def test_the_peer_over_ucxx_and_kvcr_over_nixl_work_side_by_side(
    kvcr_pipeline: Any, peer: Any
) -> None:
    ucx = {
        "transport.name": "ucx",
        "transport.options.peer": peer.address,
        "transport.op_timeout_s": 10,
    }
    peer_pipeline = build_pipeline(load_config("default", environ={}, overrides=ucx))
    kvcr = kvcr_pipeline(batching__read_batch_pages=2)
    errors: list[BaseException] = []

    def run(pipeline: Any, seed: int) -> None:
        try:
            _round_trips(pipeline, 5, seed)
        except BaseException as err:
            errors.append(err)

    try:
        threads = [
            threading.Thread(target=run, args=(peer_pipeline, 1)),
            threading.Thread(target=run, args=(kvcr, 2)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors
        assert peer_pipeline.backend.name == "peer" and kvcr.backend.name == "kvcr"
        assert peer_pipeline.stats().pages_read == kvcr.stats().pages_read == 40
    finally:
        peer_pipeline.close()
