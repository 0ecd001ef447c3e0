"""A HiCache client process for the Mooncake tests, driven by JSON lines on stdin.

Run as ``python -m tests.plugins.mooncake.sglang_client`` from the repository root. It builds
our backend the way SGLang does (``StorageBackendFactory.create_backend("dynamic", ...)``,
backend ``mooncake`` chosen by ``overrides``) on real sglang 0.5.23 host pools, one per
layout, each filled with the same random bytes in every process (a fixed seed per pool), so a
restoring process can check what it restores against its own copy of the stored pages.

Each line in is one command; each line out (stdout) is its reply, ``{"error": ...}`` when it
failed. Commands:

- ``{"op": "master", "host": H}``: start a ``mooncake_master`` here (in this process's network
  namespace); replies ``{"address": "H:PORT", "pid": ...}``. It stops when this process ends.
- ``{"op": "open", "master": ADDR, "segment_bytes": "64MiB", "overrides": {...}}``: one backend
  per layout; replies ``{"pools": [...], "refused": {...}, "hostname": ...}`` (the address the
  Mooncake client advertises).
- ``{"op": "store", "pages": N}``: ``batch_set_v1`` of pages 0..N-1 of every pool.
- ``{"op": "restore", "pages": N}``: ``batch_exists`` then ``batch_get_v1`` into pages
  N..2N-1 (poisoned first); replies per pool the count, the results, whether every page that
  arrived matches and how long each call took.
- ``{"op": "close"}``: close every backend, then exit.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from types import SimpleNamespace
from typing import Any

from tests.integrations.conftest import (
    load_sglang,
    mha_pool,
    mla_pool,
    page_bytes_of,
    token_indices,
)

PAGES = 48  # host pages per pool: stored from the first half, restored into the second
POOLS = [
    ("mha", "layer_first"),
    ("mha", "page_first"),
    ("mha", "page_first_direct"),
    ("mha", "page_head"),
    ("mla", "layer_first"),
    ("mla", "page_first"),
    ("mla", "page_first_direct"),
]


class Client:
    def __init__(self) -> None:
        self.sg: SimpleNamespace = load_sglang()
        self.backends: dict[str, Any] = {}
        self.pools: dict[str, Any] = {}
        self.master: Any = None

    def start_master(self, host: str) -> dict[str, Any]:
        from kvcr_policy_mooncake.master import MasterProcess

        self.master = MasterProcess(host)
        return {"address": self.master.address, "pid": self.master.pid}

    def open(self, master: str, segment_bytes: str, overrides: dict[str, Any]) -> dict[str, Any]:
        from kvcr_policy.bench.hicache import single_rank_config

        sg = self.sg
        refused: dict[str, Any] = {}
        for seed, (kind, layout) in enumerate(POOLS):
            name = f"{kind}-{layout}"
            extra = {
                "backend_name": "kvcr_policy",
                "module_path": "kvcr_policy.integrations.sglang",
                "class_name": "KVCRPolicyStorage",
                "interface_v1": 1,
                "overrides": {
                    "backend.name": "mooncake",
                    "backend.options.master": master,
                    "backend.options.segment_bytes": segment_bytes,
                    **overrides,
                },
            }
            config = single_rank_config(
                extra, model_name="test/mooncake", is_mla_model=kind == "mla"
            )
            backend = sg.StorageBackendFactory.create_backend("dynamic", config, None)
            make = mla_pool if kind == "mla" else mha_pool
            pool = make(sg, layout, pages=PAGES, seed=100 + seed)
            backend.register_mem_pool_host(pool)
            self.backends[name], self.pools[name] = backend, pool
            if backend.refused:
                refused[name] = backend.refused
        first = next(iter(self.backends.values()))
        transport = first.pipeline.stats().transport
        return {"pools": list(self.backends), "refused": refused, "hostname": transport["hostname"]}

    def store(self, pages: int) -> dict[str, Any]:
        stored = {}
        for name, backend in self.backends.items():
            keys = [f"page-{i}" for i in range(pages)]
            indices = token_indices(self.sg, self.pools[name], list(range(pages)))
            stored[name] = backend.batch_set_v1(keys, indices)
        return {"stored": stored}

    def restore(self, pages: int) -> dict[str, Any]:
        sg, out = self.sg, {}
        for name, backend in self.backends.items():
            pool = self.pools[name]
            keys = [f"page-{i}" for i in range(pages)]
            dst = list(range(pages, 2 * pages))
            poison(sg, pool, dst)
            t0 = time.perf_counter()
            found = backend.batch_exists(keys)
            t1 = time.perf_counter()
            got = backend.batch_get_v1(keys, token_indices(sg, pool, dst))
            t2 = time.perf_counter()
            exact = all(
                bool(sg.torch.equal(page_bytes_of(sg, pool, d), page_bytes_of(sg, pool, s)))
                for s, d, ok in zip(range(pages), dst, got, strict=True)
                if ok
            )
            out[name] = {
                "exists": found,
                "got": got,
                "exact": exact,
                "exists_s": t1 - t0,
                "get_s": t2 - t1,
            }
        return {"restored": out}

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()
        if self.master is not None:
            self.master.close()


def poison(sg: SimpleNamespace, pool: Any, pages: list[int]) -> None:
    """Zero the destination pages, the way SGLang reads them (one flat page each)."""
    zero = sg.torch.zeros_like(pool.get_data_page(0, flat=True))
    for page in pages:
        pool.set_from_flat_data_page(page * pool.page_size, zero)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    client = Client()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        try:
            if op == "master":
                reply = client.start_master(command["host"])
            elif op == "open":
                reply = client.open(**command)
            elif op == "store":
                reply = client.store(command["pages"])
            elif op == "restore":
                reply = client.restore(command["pages"])
            elif op == "close":
                client.close()
                print(json.dumps({"closed": True}), flush=True)
                return
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as err:  # the test reads the reply; the traceback goes to stderr
            logging.exception("command %r failed", op)
            reply = {"error": f"{type(err).__name__}: {err}"}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
