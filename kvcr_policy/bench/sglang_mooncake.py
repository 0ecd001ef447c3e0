"""P against SGLang 0.5.23's own Mooncake backend (``--peer sglang-mooncake``), on one master.

The run's backend must be ``mooncake``: its instance (a master on loopback and a segment
process holding every page) serves both sides. One real ``MHATokenToKVPoolHost`` is built on
the CPU (2n pages); both sides register that same host pool with a Mooncake client of their
own that contributes no segment, store its first n pages and restore them into its last n, the
way HiCache calls a storage backend (``batch_set_v1`` / ``batch_get_v1``, 128 pages a call):

- ``peer``: SGLang's ``MooncakeStore`` (two objects per page and rank, ``_k`` and ``_v``; each
  write asks which exist and puts the rest; one synchronous call per 128 pages);
- ``P``: :class:`~kvcr_policy.integrations.sglang.KVCRPolicyStorage` with P's profile on the
  ``mooncake`` backend (one object per page, zero-copy from the same registered pool).

Metadata: both answer ``batch_exists`` over the same number of stored keys
(``exists_keys``, one-token pages of a small host pool), medians of 5 queries each.
SGLang's backend takes only ``page_first`` and ``page_first_direct`` for MHA pools.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from importlib.util import find_spec
from typing import Any

import numpy as np

from ..geometry import PoolGeometry
from .hicache import StorageSide, V1Side, _threads, host_pool, open_host_pool, single_rank_config
from .plan import Plan, Side
from .setup import BenchError
from .sides import bench_keys, side_overrides
from .targets import Pool, tokens_of

__all__ = ["PEER", "SGLangMooncakeComparison"]

PEER = "sglang-mooncake"
LAYOUTS = ("page_first", "page_first_direct")  # MooncakeStore._get_mha_buffer_meta
SGLANG_MISSING = (
    f"--peer {PEER} needs sglang==0.5.23: pip install 'kvcr-policy[sglang]' on a GPU server, "
    "or bash .ci/install-sglang.sh from the source tree on a CPU-only machine"
)


def sglang_store(master: str, pool: Any) -> Any:
    """SGLang's own MooncakeStore on ``master``, as its ``extra_config`` configures it (tcp,
    P2PHANDSHAKE, no segment of its own), with ``pool`` registered."""
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore

    extra = {
        "master_server_address": master,
        "protocol": "tcp",
        "metadata_server": "P2PHANDSHAKE",
        "device_name": "",
        "global_segment_size": 0,
        "local_hostname": "127.0.0.1",
        "check_server": False,
    }
    store = MooncakeStore(single_rank_config(extra), None)
    store.register_mem_pool_host(pool)
    return store


def _close_sglang(store: Any) -> None:
    """MooncakeStore.close() leaves its client to the garbage collector: close it now."""
    store.store.close()


class SGLangMooncakeSide(V1Side):
    """SGLang's MooncakeStore (``client``) through its v1 API, as HiCache calls it."""

    pipeline = None

    def __init__(self, client: Any, master: str) -> None:
        self.label, self.name, self.path = "peer", PEER, master
        self.client = self.storage = client


def _ours(plan: Plan, started: dict[str, Any], pool: Any, metrics: bool = True) -> Any:
    from ..integrations.sglang import KVCRPolicyStorage

    overrides = side_overrides(plan, started)
    if not metrics:  # the metadata pages are not the benchmark's traffic (see sides.exists_rate)
        overrides["observability.metrics"] = False
    extra = {"interface_v1": 1, "profile": plan.setup.profile, "overrides": overrides}
    storage = KVCRPolicyStorage(single_rank_config(extra), {})
    storage.register_mem_pool_host(pool)
    return storage


def _query_rate(exists: Callable[[list[str]], int], keys: list[str], repeat: int = 5) -> float:
    timings = []
    for _ in range(repeat):
        start = time.perf_counter()
        found = exists(keys)
        timings.append(time.perf_counter() - start)
        if found != len(keys):
            raise BenchError(f"batch_exists found {found} of {len(keys)} stored keys")
    return len(keys) / statistics.median(timings)


class SGLangMooncakeComparison:
    """P (KVCRPolicyStorage on ``mooncake``) against SGLang's MooncakeStore, one master."""

    baseline = "peer"

    def __init__(self) -> None:
        self._profile = ""

    def check(self, plan: Plan) -> None:
        setup = plan.setup
        refusals = {
            "target": (setup.target != "cpu", "--target cpu (SGLang's host pool is host memory)"),
            "backend": (plan.backend.name != "mooncake", "--backend mooncake (the same master)"),
            "mla": (setup.mla, "an MHA pool (drop --mla: the comparison builds an MHA host pool)"),
            "layout": (
                setup.layout not in LAYOUTS,
                f"--layout {' or '.join(LAYOUTS)} (SGLang's Mooncake backend takes no other "
                "MHA layout)",
            ),
        }
        for what, (refused, needs) in refusals.items():
            if refused:
                raise BenchError(f"--peer {PEER} runs with {needs}; {what} differs")
        if find_spec("sglang") is None:
            raise BenchError(SGLANG_MISSING)

    def open(self, stack: ExitStack, plan: Plan) -> tuple[Pool, dict[str, Side]]:
        sglang_pool, pool, started = open_host_pool(stack, plan)
        self._profile = plan.setup.profile
        storage = _ours(plan, started, sglang_pool)
        stack.callback(storage.close)
        master = str(started["backend.options.master"])
        peer = sglang_store(master, sglang_pool)
        stack.callback(_close_sglang, peer)
        ours = StorageSide(plan.setup.profile, storage)
        return pool, {"P": ours, "peer": SGLangMooncakeSide(peer, master)}

    def exists_rates(self, plan: Plan) -> dict[str, float]:
        """Keys per second of ``batch_exists`` on both sides over the same number of stored
        keys, each on its own key space of one fresh backend instance."""
        n = plan.setup.exists_keys
        tiny = PoolGeometry("kv", "page_first", 1, 1, 8, "bfloat16", 1, 2 * n)
        keys = bench_keys(n, "exists")
        src = tokens_of(1, np.arange(n, dtype=np.int64))
        with ExitStack() as stack:
            _threads(stack)
            sglang_pool = host_pool(tiny)
            started = stack.enter_context(plan.backend.start("exists", plan.setup.profile, tiny))
            storage = _ours(plan, started, sglang_pool, metrics=False)
            stack.callback(storage.close)
            peer = sglang_store(str(started["backend.options.master"]), sglang_pool)
            stack.callback(_close_sglang, peer)
            rates = {}
            sides: list[tuple[str, Side, Callable[[list[str]], int]]] = [
                ("P", StorageSide(plan.setup.profile, storage), storage.batch_exists),
                ("peer", SGLangMooncakeSide(peer, ""), peer.batch_exists),
            ]
            for label, side, exists in sides:
                if not side.store(keys, src):
                    raise BenchError(f"{label} did not store all {n} metadata keys")
                rates[label] = _query_rate(exists, keys)
        return rates

    def describe(self) -> dict[str, Any]:
        return {"peer": PEER, "profile": self._profile}
