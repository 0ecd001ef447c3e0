"""KVCRPolicyStorage: kvcr_policy as the L3 storage backend of SGLang's HiCache (sglang==0.5.23).

SGLang loads it with its own ``StorageBackendFactory``::

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
      '{"backend_name": "kvcr_policy", "module_path": "kvcr_policy.integrations.sglang",
        "class_name": "KVCRPolicyStorage", "interface_v1": 1, "profile": "throughput"}'

and builds it as ``cls(storage_config, kwargs)`` (``_create_dynamic_backend`` in
``sglang/srt/mem_cache/storage/backend_factory.py``), without a host pool: pools arrive later
through ``register_mem_pool_host`` (the KV anchor) and ``register_mem_host_pool_v2`` (every pool
of the host pool group, by name). Three API levels, all over one :class:`~kvcr_policy.Pipeline`:

- v1, zero-copy (``interface_v1`` truthy): ``batch_get_v1`` / ``batch_set_v1`` move pages
  straight between the host pool's ``kv_buffer`` and the DRAM tier.
- v2, per pool: ``batch_exists_v2`` / ``batch_get_v2`` / ``batch_set_v2`` with
  :class:`PoolTransfer`; the usable prefix is the minimum over pools, as in ``HiCacheFile``.
- v0, tensors: ``get`` / ``set`` / ``batch_get`` / ``batch_set`` / ``exists``, staged through a
  flat pool (:mod:`.sglang_v0`). With ``interface_v1`` falsy SGLang moves KV pages this way, and
  ``batch_exists`` then answers for these pages.

Data-path failures never escape: they are logged and become correctly shaped misses, so a
prefetch or backup thread never dies. A pool the pipeline refuses fails closed (misses) while
the others keep working.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

try:
    from sglang.srt.mem_cache.hicache_storage import (
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
        PoolName,
        PoolTransfer,
        PoolTransferResult,
    )
except ImportError as err:  # bind the message, then raise (STYLE.md)
    _message = (
        f"kvcr_policy.integrations.sglang needs SGLang 0.5.23 ({err}). On a GPU server: "
        "pip install 'kvcr-policy[sglang]' (or pip install sglang==0.5.23); on a CPU-only "
        "machine, from the kvcr_policy source tree: bash .ci/install-sglang.sh"
    )
    raise ImportError(_message) from err

from ..errors import ClosedError, KVCRPolicyError, UnimplementedError
from ..geometry import PoolGeometry
from ..loading import PROFILE_ENV, LoadedConfig, load_config
from ..pipeline import Pipeline, build_pipeline
from .sglang_config import BackendOptions, parse_extra_config
from .sglang_metrics import CallSamples, storage_metrics
from .sglang_pools import Namespace, flat_geometry, geometry_of, namespace_for, pool_name
from .sglang_prefix import PoolQuery, usable_prefix
from .sglang_v0 import FlatPages

__all__ = ["KVCRPolicyStorage"]

log = logging.getLogger("kvcr_policy.integrations.sglang")

KV: Final = "kv"
V0_POOL: Final = "kv.v0"


@dataclass(frozen=True, slots=True)
class _Binding:
    """A registered SGLang host pool: its pipeline pool and key namespace."""

    name: str
    host_pool: Any
    geometry: PoolGeometry
    namespace: Namespace


class KVCRPolicyStorage(HiCacheStorage):
    """SGLang HiCache storage backend over a kvcr_policy pipeline; see the module docstring.

    ``storage_config`` is SGLang's ``HiCacheStorageConfig``; its ``extra_config`` may name a
    ``profile`` and ``overrides`` (see :mod:`.sglang_config`). ``kwargs`` is what SGLang's
    factory passes second (an empty dict); it may carry the same two keys.
    """

    def __init__(
        self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None
    ) -> None:
        self.storage_config = storage_config
        self.options: BackendOptions = parse_extra_config(storage_config.extra_config, kwargs)
        self.loaded: LoadedConfig = load_config(self.options.profile, None, self.options.overrides)
        self.pipeline: Pipeline = build_pipeline(self.loaded)
        self.refused: dict[str, str] = {}
        self._bindings: dict[str, _Binding] = {}
        self._refused_pools: dict[str, Any] = {}
        self._v0: FlatPages | None = None
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._samples = CallSamples(enabled=bool(storage_config.enable_storage_metrics))
        self._log_start()

    # ---- start-up -----------------------------------------------------------------------

    def _log_start(self) -> None:
        c = self.storage_config
        if self.options.profile is not None:
            where = self.options.profile_origin
        elif self.loaded.profile is not None:
            where = f"env {PROFILE_ENV}"
        else:
            where = "no profile named: schema defaults, upstream behaviour"
        log.info(
            "kvcr_policy HiCache backend for model %r, tp %d/%d, pp %d/%d, attn-cp %d/%d, dp %d: "
            "profile %s (from %s), interface_v1=%s",
            c.model_name,
            c.tp_rank,
            c.tp_size,
            c.pp_rank,
            c.pp_size,
            c.attn_cp_rank,
            c.attn_cp_size,
            getattr(c, "dp_rank", 0),
            self.loaded.profile or "default",
            where,
            int(self.options.interface_v1),
        )
        for path, (value, origin) in self.loaded.changed().items():
            log.info("kvcr_policy: %s = %r (from %s)", path, value, origin)
        if getattr(c, "should_split_heads", False):
            log.warning(
                "kvcr_policy: tp_lcm_size asks for split-head page sharing between TP sizes; "
                "not supported: each TP size keeps its own pages"
            )

    # ---- pools --------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        super().register_mem_pool_host(mem_pool_host)
        self._attach(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._attach(pool_name(host_pool_name), host_pool)

    def on_host_pools_registered(self) -> None:
        kept = ", ".join(f"{n} ({b.geometry.layout})" for n, b in self._bindings.items())
        refused = "; ".join(f"{n}: {why}" for n, why in self.refused.items())
        log.info("kvcr_policy pools: %s; refused (misses): %s", kept or "none", refused or "none")

    def _attach(self, name: str, host_pool: Any) -> None:
        """Register ``host_pool`` as pipeline pool ``name``; on refusal, log and fail closed."""
        with self._lock:
            bound = self._bindings.get(name)
            if bound is not None and bound.host_pool is host_pool:
                return  # the KV anchor arrives through both registration calls
            if self._refused_pools.get(name) is host_pool:
                return  # refused already; trying again would only repeat the error
            if bound is not None:
                del self._bindings[name]
                self.refused[name] = (
                    "registered again with another host pool; its pages now miss, since the "
                    "tier cannot tell which pool's pages it holds"
                )
                log.error("kvcr_policy: pool %r %s", name, self.refused[name])
                return
            try:
                geometry = geometry_of(host_pool, name)
                self.pipeline.register_pool(name, geometry, host_pool.kv_buffer)
            except Exception as err:
                self.refused[name] = str(err)
                self._refused_pools[name] = host_pool
                log.error("kvcr_policy: %s; pool %r fails closed (misses)", err, name)
                return
            tag = getattr(host_pool, "storage_format_tag", None)
            namespace = namespace_for(self.storage_config, name, geometry, format_tag=tag)
            self._bindings[name] = _Binding(name, host_pool, geometry, namespace)
            self.refused.pop(name, None)
            log.info("kvcr_policy: pool %r: %s; keys %s", name, geometry, namespace.label)

    def _binding(self, name: str) -> _Binding | None:
        binding = self._bindings.get(name)
        if binding is None:
            reason = self.refused.get(name, "no host pool of that name was registered")
            self._warn_once(f"pool:{name}", "kvcr_policy: pool %r misses: %s", name, reason)
        return binding

    def _warn_once(self, tag: str, message: str, *args: object) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            log.warning(message, *args)

    def _failed(self, call: str, name: str, n: int, err: Exception) -> None:
        if isinstance(err, KVCRPolicyError):
            log.warning("kvcr_policy: %s of %d pages of pool %r missed: %s", call, n, name, err)
        else:
            log.exception("kvcr_policy: %s of %d pages of pool %r failed", call, n, name)

    # ---- the zero-copy data path (v1 and v2) ----------------------------------------------

    def _move(self, op: str, name: str, keys: Sequence[str], host_indices: Any) -> list[bool]:
        n = len(keys)
        binding = self._binding(name)
        if binding is None or n == 0:
            if n and (name in self.refused or name == KV):  # SGLang's own pool names only
                self.pipeline.count_misses(name, op == "get", "pool_refused", n)
            return [False] * n
        call: Callable[..., list[bool]] = self.pipeline.get if op == "get" else self.pipeline.set
        start = time.perf_counter()
        try:
            done = call(binding.namespace.keys(keys), host_indices, name)
        except Exception as err:
            self._failed(op, name, n, err)
            return [False] * n
        done = [bool(x) for x in done[:n]] + [False] * (n - len(done))
        moved = done.index(False) if False in done else n
        self._samples.record(
            op, moved, moved * binding.geometry.page_bytes, time.perf_counter() - start
        )
        return done

    def _count(self, name: str, keys: Sequence[str]) -> int:
        """Consecutive present keys of pool ``name`` from the start; 0 on any failure."""
        if not keys:
            return 0
        try:
            if name == V0_POOL:
                return self._v0.exists(keys) if self._v0 is not None else 0
            binding = self._binding(name)
            if binding is None:
                return 0
            return self.pipeline.exists(binding.namespace.keys(keys), name)
        except Exception as err:
            self._failed("exists", name, len(keys), err)
            return 0

    def _kv_pool(self) -> str:
        # SGLang moves KV pages through v1 when interface_v1 is truthy, else through v0
        # (cache_controller.py, attach_storage_backend): exists answers for that path.
        return KV if self.options.interface_v1 else V0_POOL

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        return self._count(self._kv_pool(), keys)

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

        See :mod:`.sglang_prefix`: ``all_pages`` and ``trailing_pages`` gate the prefix;
        ``block_groups`` never gates the KV hit and gets no verdict from this backend.
        """
        kv_pages = self._count(self._kv_pool(), keys)
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
            self._warn_once(
                f"policy:{query.policy}",
                "kvcr_policy: hit policy %s (pool %r) is not supported: no verdict",
                query.policy,
                pool_name(query.name),
            )
        hit_count: dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        hit_count.update(prefix.hits)
        return PoolTransferResult(prefix.pages, hit_count, prefix.ends)

    # ---- the tensor data path (v0) --------------------------------------------------------

    def _flat_pages(self, page_bytes: int | None) -> FlatPages | None:
        """The v0 staging pool, opened on first use with the size of the first page seen."""
        if self._v0 is not None:
            return self._v0
        kv = self._bindings.get(KV)
        if page_bytes is None and kv is not None:
            page_bytes = kv.geometry.page_bytes
        if page_bytes is None or page_bytes <= 0:
            return None
        with self._lock:
            if self._v0 is None:
                # The flat bytes of a page follow the KV pool's layout, so its digest goes in.
                described = kv.geometry if kv is not None else flat_geometry(V0_POOL, page_bytes, 1)
                namespace = namespace_for(self.storage_config, V0_POOL, described)
                self._v0 = FlatPages(self.pipeline, V0_POOL, page_bytes, namespace)
                log.info("kvcr_policy: v0 pages of %d bytes; keys %s", page_bytes, namespace.label)
        return self._v0

    @staticmethod
    def _unsupported_sizes(target_sizes: Any) -> None:
        if target_sizes is not None:
            message = (
                "kvcr_policy's tensor API moves whole pages and takes no target_sizes; "
                "use interface_v1 for zero-copy transfers"
            )
            raise UnimplementedError(message)

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Store one page tensor per key; True only if every key is now stored."""
        self._unsupported_sizes(target_sizes)
        if not keys:
            return True
        values = list(values) if values is not None else []
        first = values[0] if values else None
        try:
            nbytes = first.numel() * first.element_size() if first is not None else None
            pages = self._flat_pages(nbytes)
            if pages is None:
                return False
            return all(pages.set(keys, values))
        except Exception as err:
            self._failed("set", V0_POOL, len(keys), err)
            return False

    def set(
        self,
        key: str,
        value: Any = None,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        return self.batch_set([key], [value], None, target_sizes)

    def batch_get(
        self,
        keys: list[str],
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> list[Any]:
        """Restore pages into ``target_locations`` (flat page tensors); None per miss."""
        self._unsupported_sizes(target_sizes)
        targets = list(target_locations) if target_locations is not None else None
        first = targets[0] if targets else None
        try:
            nbytes = first.numel() * first.element_size() if first is not None else None
            pages = self._flat_pages(nbytes)
            if pages is None:
                return [None] * len(keys)
            return pages.get(keys, targets)
        except Exception as err:
            self._failed("get", V0_POOL, len(keys), err)
            return [None] * len(keys)

    def get(
        self,
        key: str,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> Any:
        return self.batch_get([key], [target_location], target_sizes)[0]

    def exists(self, key: str) -> bool:
        return self._count(V0_POOL, [key]) == 1

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
