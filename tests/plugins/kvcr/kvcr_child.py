"""A process that restores pages through the ``kvcr`` backend in a loop, for the kill tests.

``python kvcr_child.py PORT G3_FOLDER``: one pool (MLA page-first, 4 KiB pages, so KVCR's G3
file tier can hold them) on the listen port PORT, with G3 files in G3_FOLDER. It prints
``ready`` once pages are stored, ``restoring`` before each restore, and on SIGTERM closes the
pipeline and prints one JSON line: the pool's state after close.
"""

from __future__ import annotations

import json
import signal
import sys
import threading

import numpy as np

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.geometry import PoolGeometry

GEOMETRY = PoolGeometry("kv", "page_first", 4, 1, 128, "float16", 4, 4 * 256, mla=True)


def main(port: int, folder: str) -> None:
    overrides = {
        "backend.name": "kvcr",
        "backend.options.listen_port": port,
        "backend.options.g3_paths": [f"{folder}/g3"],
        "backend.options.g3_capacity_bytes_per_file": 64 * GEOMETRY.page_bytes,
        "placement.capacity_bytes": 64 * GEOMETRY.page_bytes,
        "batching.read_batch_pages": 4,
    }
    pipeline = build_pipeline(load_config("default", environ={}, overrides=overrides))
    buffer = np.random.default_rng(0).integers(0, 255, GEOMETRY.nbytes, dtype=np.uint8)
    pipeline.register_pool("kv", GEOMETRY, buffer.view(np.float16).reshape(GEOMETRY.shape))
    n = 96  # more than DRAM holds: restores read G3 too
    keys = [f"child-{i}" for i in range(n)]
    tokens = np.arange(n * GEOMETRY.page_size)
    assert all(pipeline.set(keys, tokens))
    stop = threading.Event()

    def terminate(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, terminate)
    print("ready", flush=True)
    while not stop.is_set():
        print("restoring", flush=True)
        pipeline.get(keys, tokens + 128 * GEOMETRY.page_size)
    pool = pipeline._pools["kv"][1]
    pipeline.close()
    audit = pool.audit()  # the region's own audit (Pipeline.audit() refuses after close)
    state = {
        "claims": pool.runner.claims,
        "quiescent": pool.runner.quiescent,
        "region": audit["state"],
        "leaked": audit["leaked"],
    }
    print(json.dumps(state), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
