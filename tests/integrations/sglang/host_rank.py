"""One TP rank of an SGLang engine, as its own process: our backend built by SGLang's factory
with the documented default set-up (no backend named), a real MLA (or MHA) host pool.

``python -m tests.integrations.sglang.host_rank RANK SIZE MLA STORED_FILE [EXTRA_JSON]``: rank
0 fills pages 0..7 with its own bytes (seed 0) and stores them through ``batch_set_v1`` (MLA:
as SGLang, only rank 0 writes), then creates STORED_FILE. Every rank then waits for that file,
counts its hits (``batch_exists``) and restores the 8 pages into pages 16..23 of its own pool,
and prints one JSON line: hits, restored pages, byte-exact pages (compared with the bytes rank
0 stored, which every rank can make: same seed) and the backend chosen.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tests.integrations.conftest import (
    dynamic_extra,
    load_sglang,
    mha_pool,
    mla_pool,
    page_bytes_of,
    same_tensors,
    token_indices,
)

PAGES = list(range(8))
TARGET = list(range(16, 24))


def main() -> None:
    rank, size, mla = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "mla"
    stored = Path(sys.argv[4])
    extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    sg = load_sglang()
    from kvcr_policy.bench.hicache import single_rank_config

    make = mla_pool if mla else mha_pool
    pool = make(sg, "page_first", seed=0)
    reference = make(sg, "page_first", seed=0)  # rank 0's bytes, made here as well
    config = single_rank_config(
        dynamic_extra(**extra), tp_rank=rank, tp_size=size, is_mla_model=mla, model_name="m"
    )
    backend = sg.StorageBackendFactory.create_backend("dynamic", config, None)
    backend.register_mem_pool_host(pool)
    keys = [f"page-{p}" for p in PAGES]
    if rank == 0:
        assert backend.batch_set_v1(keys, token_indices(sg, pool, PAGES)) == [True] * len(keys)
        stored.write_text("stored")
    deadline = time.monotonic() + 300
    while not stored.exists():
        if time.monotonic() > deadline:
            raise SystemExit("rank 0 never stored its pages")
        time.sleep(0.05)
    hits = backend.batch_exists(keys)
    done = backend.batch_get_v1(keys, token_indices(sg, pool, TARGET))
    exact = sum(
        same_tensors(page_bytes_of(sg, pool, t), page_bytes_of(sg, reference, p))
        for p, t, ok in zip(PAGES, TARGET, done, strict=True)
        if ok
    )
    line = {
        "rank": rank,
        "hits": hits,
        "restored": sum(bool(x) for x in done),
        "exact": exact,
        "backend": backend.pipeline.backend.name,
        "origin": backend.loaded.origin("backend.name"),
    }
    print(json.dumps(line), flush=True)
    backend.close()


if __name__ == "__main__":
    main()
