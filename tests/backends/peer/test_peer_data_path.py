"""The peer's data path as docs/peer.md states it, observed from outside the code under test.

- "Metadata queries take one round trip per metadata-query batch": the client's control
  connection goes through a forwarding proxy that records who sent what, in causal order.
- "Reads land directly in the pool's memory (no staging copy)": in a fresh client process,
  every buffer handed to ucxx while a get runs is recorded (ucxx wraps each one in
  ``ucxx._lib.arr.Array``); each must lie inside the pool, and together they must cover
  exactly the bytes of the destination pages, each once.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kvcr_policy import build_pipeline, load_config
from tests.backends.peer.peer_helpers import Serve, need_ucxx
from tests.backends.peer.proxy import Proxy
from tests.support.paths import child_env
from tests.support.pools import fresh_keys

pytestmark = [pytest.mark.ucx, pytest.mark.usefixtures("load")]

SETS = {"transport.name": "ucx", "placement.capacity_bytes": "64MiB"}


@pytest.fixture(scope="module")
def server() -> Iterator[Serve]:
    need_ucxx()
    serve = Serve(SETS)
    yield serve
    assert serve.stop() == 0


@pytest.mark.parametrize(("stored", "keys", "batch"), [(10, 10, 3), (5, 10, 3), (0, 7, 2)])
def test_exists_takes_one_round_trip_per_query_batch(
    server: Serve, stored: int, keys: int, batch: int
) -> None:
    from tests.support.pools import geometry, pool_buffer, token_indices

    proxy = Proxy(server.address)
    overrides = {
        "transport.name": "ucx",
        "transport.options.peer": proxy.address,
        "transport.options.shared_memory": "off",  # every frame through the proxy
        "transport.options.heartbeat_s": 600,  # no ping while the test counts
        "batching.query_batch_keys": batch,
    }
    pipeline = build_pipeline(load_config("default", overrides=overrides))
    try:
        geo = geometry("page_first", pages=16)
        pipeline.register_pool("kv", geo, pool_buffer(geo))
        names = fresh_keys(keys)
        assert all(pipeline.set(names[:stored], token_indices(range(stored), geo.page_size)))
        since = proxy.mark()
        assert pipeline.exists(names) == stored
        # Batches are asked in order until one comes back short (or all are asked).
        expected = min(math.ceil(keys / batch), stored // batch + 1)
        assert proxy.round_trips(since) == expected
    finally:
        pipeline.close()
        proxy.close()


# A fresh client process: ucxx's Array is replaced by a subclass that records the address and
# size of every buffer wrapped for UCX while the get runs (the engine imports Array when it
# starts, which is after this replacement).
RECEIVES = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import ucxx._lib.arr as arr

    recording, posted = [False], []

    class Recorded(arr.Array):
        def __init__(self, obj):
            if recording[0]:
                posted.append((int(self.ptr), int(self.nbytes)))

    arr.Array = Recorded

    from tests.support.pools import geometry, pool_buffer, token_indices
    from kvcr_policy import build_pipeline, load_config

    address, profile, layout = sys.argv[1:4]
    overrides = {"transport.name": "ucx", "transport.options.peer": address,
                 "transport.options.shared_memory": "off", "coalescing.split_bytes": 1000}
    geo = geometry(layout, pages=16)
    buffer = pool_buffer(geo, 5)
    with build_pipeline(load_config(profile, overrides=overrides)) as pipeline:
        pipeline.register_pool("kv", geo, buffer)
        keys = [f"{profile}-{layout}-{i}" for i in range(6)]
        assert all(pipeline.set(keys, token_indices([0, 1, 2, 3, 4, 5], geo.page_size)))
        recording[0] = True
        result = pipeline.get(keys, token_indices([9, 10, 11, 14, 7, 8], geo.page_size))
        recording[0] = False
    print(json.dumps({"pool": [int(buffer.ctypes.data), int(buffer.nbytes)],
                      "posted": posted, "result": result}))
    """
)


@pytest.mark.parametrize(
    ("profile", "layout"),
    [("default", "layer_first"), ("throughput", "layer_first"), ("throughput", "page_head")],
)
def test_reads_are_received_straight_into_the_pool_pages(
    server: Serve, profile: str, layout: str
) -> None:
    from tests.support.pools import geometry, page_slice

    done = subprocess.run(
        [sys.executable, "-c", RECEIVES, server.address, profile, layout],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["result"] == [True] * 6
    base, size = report["pool"]
    geo = geometry(layout, pages=16)
    # Which bytes of the pool the destination pages are, from the buffer's own indexing.
    elements = np.arange(math.prod(geo.shape)).reshape(geo.shape)
    itemsize = 2  # float16
    wanted = np.zeros(size, dtype=np.int64)
    for page in (9, 10, 11, 14, 7, 8):
        first = elements[page_slice(geo, page)].reshape(-1) * itemsize
        for offset in range(itemsize):
            wanted[first + offset] += 1
    received = np.zeros(size, dtype=np.int64)
    for ptr, nbytes in report["posted"]:
        assert base <= ptr and ptr + nbytes <= base + size, (
            f"a receive of {nbytes} bytes at {ptr:#x} lies outside the pool "
            f"[{base:#x}, {base + size:#x}): a staging buffer"
        )
        received[ptr - base : ptr - base + nbytes] += 1
    assert np.array_equal(received, wanted), "receives do not cover the pages exactly once"
