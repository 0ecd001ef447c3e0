"""KVCRPolicyStorage: kvcr_policy as the L3 storage backend of SGLang's HiCache (sglang==0.5.23).

SGLang loads it with its own ``StorageBackendFactory``::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
      '{"backend_name": "kvcr_policy", "module_path": "kvcr_policy.integrations.sglang",
        "class_name": "KVCRPolicyStorage", "interface_v1": 1, "profile": "throughput"}'

and builds it as ``cls(storage_config, kwargs)`` (``_create_dynamic_backend`` in
``sglang/srt/mem_cache/storage/backend_factory.py``), without a host pool: pools arrive later
through ``register_mem_pool_host`` (the KV anchor) and ``register_mem_host_pool_v2`` (every pool
of the host pool group, by name), each bound by :func:`.bindings.bind`. The whole
``HiCacheStorage`` contract of 0.5.23, over one :class:`~kvcr_policy.Pipeline`:

- v1 (``interface_v1`` truthy): ``batch_get_v1`` / ``batch_set_v1`` / ``batch_exists``;
- v2, per pool: ``batch_exists_v2`` / ``batch_get_v2`` / ``batch_set_v2`` with
  :class:`PoolTransfer`; the usable prefix is the minimum over pools, as in ``HiCacheFile``;
- v0: ``get`` / ``set`` / ``batch_get`` / ``batch_set`` / ``exists`` in tensor and pointer
  forms (:mod:`.tensor_api`); with ``interface_v1`` falsy SGLang moves KV pages this way, and
  ``batch_exists`` then answers for these pages.

Data-path failures never escape: they are logged and become correctly shaped misses, so a
prefetch or backup thread never dies. A pool refused at registration fails closed (misses)
while the others keep working.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from ...config.loading import LoadedConfig
from ...declined import DeclinedKeys
from ...errors import ClosedError
from ...pipeline import Pipeline, build_pipeline
from .bindings import Binding
from .config import BackendOptions, parse_extra_config
from .flat import FlatObjects
from .metrics import CallSamples, storage_metrics
from .pool_set import KV, HostPools
from .pools import Namespace, namespace_for, pool_name
from .prefix import PoolQuery, usable_prefix
from .startup import flag_origin, load, log_start
from .tensor_api import TensorAPI, TensorCalls

__all__ = ["KVCRPolicyStorage"]

log = logging.getLogger("kvcr_policy.integrations.sglang")


class KVCRPolicyStorage(TensorCalls, HiCacheStorage):
    """SGLang HiCache storage backend over a kvcr_policy pipeline; see the module docstring.

    ``storage_config`` is SGLang's ``HiCacheStorageConfig``; its ``extra_config`` may name a
    ``profile`` and ``overrides`` (see :mod:`.config`). ``kwargs`` is what SGLang's factory
    passes second (an empty dict); it may carry the same two keys.
    """

    def __init__(
        self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None
    ) -> None:
        self.storage_config = storage_config
        self.options: BackendOptions = parse_extra_config(
            storage_config.extra_config, kwargs, origin=flag_origin()
        )
        self.loaded: LoadedConfig = load(self.options, storage_config)
        self.pipeline: Pipeline = build_pipeline(self.loaded)
        self._pools = HostPools(self.pipeline, storage_config)
        self._samples = CallSamples(enabled=bool(storage_config.enable_storage_metrics))
        self._objects = FlatObjects(self.pipeline, self._flat_namespace)
        self._tensors = TensorAPI(self._objects, self._pools.memory, self._pools.kv_page_bytes)
        log_start(self)

    @property
    def declined(self) -> DeclinedKeys:
        """The pages a lookup declined (in the tier, computed by SGLang): the pipeline's
        admission notes them, and the writes of them are left out (:mod:`...declined`)."""
        return self.pipeline.admission.declined

    # ---- pools --------------------------------------------------------------------------

    @property
    def pools(self) -> dict[str, Binding]:
        """Every bound host pool by SGLang's name (see :mod:`.pool_set`)."""
        return self._pools.bound

    @property
    def refused(self) -> dict[str, str]:
        """Every refused host pool by SGLang's name, with the reason."""
        return self._pools.refused

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._pools.attach(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._pools.attach(pool_name(host_pool_name), host_pool)

    def on_host_pools_registered(self) -> None:
        log.info("%s", self._pools.summary())

    def _flat_namespace(self, name: str, nbytes: int) -> Namespace:
        # Tensor-form pages follow the KV pool's layout, so its digest goes in when bound.
        kv = self.pools.get(KV)
        layout = kv.namespace.prefix if kv is not None else "none"
        return namespace_for(self.storage_config, name, f"flat:{nbytes}:kv={layout}")

    # ---- the data path of registered pools (v1 and v2) ------------------------------------

    def _move(self, op: str, name: str, keys: Sequence[str], host_indices: Any) -> list[bool]:
        n = len(keys)
        binding = self._pools.get(name)
        if binding is None or n == 0:
            if n and (name in self.refused or name == KV):  # SGLang's own pool names only
                self.pipeline.count_misses(name, op == "get", "pool_refused", n)
            return [False] * n
        start = time.perf_counter()
        try:
            mover = binding.mover
            call = mover.get if op == "get" else mover.set
            if op == "set":  # the pages a lookup declined are in the tier
                call = self.declined.skipping(name, keys, call)
            done = call(binding.namespace.keys(keys), host_indices)
        except Exception as err:
            self._failed(op, name, n, err)
            return [False] * n
        done = [bool(x) for x in done[:n]] + [False] * (n - len(done))
        moved = done.index(False) if False in done else n
        self._samples.record(op, moved, moved * binding.page_bytes, time.perf_counter() - start)
        return done

    def _count(self, name: str, keys: Sequence[str]) -> int:
        """Consecutive present keys of pool ``name`` from the start; 0 on any failure."""
        if not keys:
            return 0
        try:
            binding = self._pools.get(name)
            if binding is None:
                return 0
            return int(binding.mover.exists(binding.namespace.keys(keys)))
        except Exception as err:
            self._failed("exists", name, len(keys), err)
            return 0

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        # SGLang moves KV pages through v1 when interface_v1 is truthy, else through the
        # tensor API (cache_controller.py, attach_storage_backend): exists answers for that.
        if not self.options.interface_v1:
            try:
                found = self._objects.exists(keys, self._pools.kv_page_bytes())
            except Exception as err:
                self._failed("exists", "v0", len(keys), err)
                return 0
            return self._admit(keys, found, list(self.pipeline.pools))
        kv = self.pools.get(KV)
        if kv is not None and kv.kind == "logical":
            # As MooncakeStore: a logical anchor has no KV object; only batch_exists_v2,
            # which asks its side pools, can say what is restorable.
            return 0
        return self._admit(keys, self._count(KV, keys), [KV])

    def _admit(self, keys: list[str], found: int, pools: list[str]) -> int:
        """How many of ``found`` leading present ``keys`` to report (``admission.strategy``: a
        page not reported is recomputed, and not written again); every page when the admission
        cannot be asked."""
        names = [name for name in pools if name in self.pipeline.pools]
        if found <= 0 or not names:
            return found
        try:
            return self.pipeline.admit(found, names, keys)  # the declined ones noted
        except Exception as err:  # the gate must never turn a lookup into a failure
            log.warning("kvcr_policy: admission of %d pages failed, all admitted: %s", found, err)
            return found

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: Any,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._move("get", KV, keys, host_indices)

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: Any,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        return self._move("set", KV, keys, host_indices)

    def _transfers(self, op: str, transfers: list[PoolTransfer]) -> dict[Any, list[bool]]:
        # Keyed by transfer.name exactly as given, like HiCacheFile._batch_io_v2.
        results: dict[Any, list[bool]] = {}
        for transfer in transfers:
            keys = list(transfer.keys or [])
            if transfer.host_indices is None:
                log.error("kvcr_policy: %s_v2 of pool %r without host_indices", op, transfer.name)
                results[transfer.name] = [False] * len(keys)
                continue
            results[transfer.name] = self._move(
                op, pool_name(transfer.name), keys, transfer.host_indices
            )
        return results

    def batch_get_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[Any, list[bool]]:
        return self._transfers("get", transfers)

    def batch_set_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[Any, list[bool]]:
        return self._transfers("set", transfers)

    def batch_exists_v2(
        self,
        keys: list[str],
        pool_transfers: list[PoolTransfer] | None = None,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> PoolTransferResult:
        """The usable prefix over the KV pool and every pool transfer, as HiCacheFile does.

        See :mod:`.prefix`: ``all_pages`` and ``trailing_pages`` gate the prefix;
        ``block_groups`` never gates the KV hit and gets no verdict from this backend.
        """
        kv = self.pools.get(KV)
        if self.options.interface_v1 and kv is not None and kv.kind == "logical":
            kv_pages = len(keys)  # the side pools decide, as MooncakeStore does
        else:
            kv_pages = self.batch_exists(keys, extra_info)
        queries = [
            PoolQuery(t.name, str(getattr(t.hit_policy, "value", t.hit_policy)), len(t.keys or []))
            for t in pool_transfers or []
        ]

        def leading(name: Any, n: int) -> int:
            return self._count(pool_name(name), keys[:n])

        def present(name: Any, n: int) -> list[bool]:
            return [self._count(pool_name(name), [key]) == 1 for key in keys[:n]]

        prefix = usable_prefix(kv_pages, queries, leading, present)
        for query in prefix.skipped:
            self._pools.warn_once(
                f"policy:{query.policy}",
                "kvcr_policy: hit policy %s (pool %r) is not supported: no verdict",
                query.policy,
                pool_name(query.name),
            )
        hit_count: dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        hit_count.update(prefix.hits)
        return PoolTransferResult(prefix.pages, hit_count, prefix.ends)

    # ---- housekeeping -----------------------------------------------------------------

    def clear(self) -> None:
        """Forget every page of every pool (the tier memory stays reserved)."""
        try:
            self.pipeline.clear()
        except Exception as err:
            self._failed("clear", "*", 0, err)

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics (samples since the last call), plus ``.kvcr_policy``.

        ``kvcr_policy`` is the pipeline's stats (``Pipeline.stats().to_dict()``); the samples
        are kept only when SGLang's ``enable_storage_metrics`` is on.
        """
        metrics = storage_metrics(self._samples)
        stats: Any
        try:
            stats = self.pipeline.stats()
        except ClosedError:  # closed meanwhile: its last counters
            stats = self.pipeline.final_stats
        metrics.kvcr_policy = stats.to_dict() if stats is not None else {}
        return metrics

    def close(self) -> None:
        """Close the pipeline: wait for in-flight calls, then release the tier. Idempotent."""
        self.pipeline.close()
