"""The host pools SGLang registered with one backend: bound, refused, and the memory they own.

SGLang registers the KV anchor through ``register_mem_pool_host`` and every pool of a host pool
group through ``register_mem_host_pool_v2``, the anchor again among them; a group may also
arrive whole. :class:`HostPools` binds each once (:func:`.bindings.bind`), remembers a refusal
with its reason so that a pool is not retried, refuses a name registered again with another
pool (the tier could no longer tell whose pages it holds), and answers which memory the tensor
API's pointers may name. A tier larger than the memory this process can get
(:class:`~kvcr_policy.errors.TierMemoryError`) is no refusal: it fails the engine's start with
its message, where a pool that misses for ever would only hide it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ...errors import TierMemoryError
from ...pipeline import Pipeline
from .bindings import Binding, bind
from .memory import MemoryMap
from .pools import pool_name

__all__ = ["KV", "HostPools"]

log = logging.getLogger("kvcr_policy.integrations.sglang")

KV = "kv"


class HostPools:
    """Every pool bound or refused, by SGLang's pool name."""

    def __init__(self, pipeline: Pipeline, storage_config: Any) -> None:
        self._pipeline = pipeline
        self._storage_config = storage_config
        self.bound: dict[str, Binding] = {}
        self.refused: dict[str, str] = {}
        self._refused_pools: dict[str, Any] = {}
        self._memory: MemoryMap | None = None
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    def attach(self, name: str, host_pool: Any) -> None:
        """Bind ``host_pool`` as pool ``name`` (a group: its anchor, then its members by name);
        on refusal, log and fail closed."""
        entries = getattr(host_pool, "entries", None)
        anchor = getattr(host_pool, "anchor_entry", None)
        if anchor is not None and entries is not None:
            self.attach(name, anchor.host_pool)
            for entry in entries:
                if entry is not anchor:
                    self.attach(pool_name(entry.name), entry.host_pool)
            return
        with self._lock:
            bound = self.bound.get(name)
            if bound is not None and bound.host_pool is host_pool:
                return  # the KV anchor arrives through both registration calls
            if self._refused_pools.get(name) is host_pool:
                return  # refused already; trying again would only repeat the error
            self._memory = None
            if bound is not None:
                del self.bound[name]
                self.refused[name] = (
                    "registered again with another host pool; its pages now miss, since the "
                    "tier cannot tell which pool's pages it holds"
                )
                log.error("kvcr_policy: pool %r %s", name, self.refused[name])
                return
            try:
                binding = bind(self._pipeline, self._storage_config, name, host_pool)
            except TierMemoryError:
                raise  # the deployment's memory, not this pool: the engine must not start so
            except Exception as err:
                self.refused[name] = str(err)
                self._refused_pools[name] = host_pool
                log.error("kvcr_policy: %s; pool %r fails closed (misses)", err, name)
                return
            self.bound[name] = binding
            self.refused.pop(name, None)
            log.info("kvcr_policy: pool %r: %s; keys %s", name, binding.description,
                     binding.namespace.label)  # fmt: skip

    def get(self, name: str) -> Binding | None:
        """The binding of ``name``; None (warned once per name) when it has none."""
        binding = self.bound.get(name)
        if binding is None:
            reason = self.refused.get(name, "no host pool of that name was registered")
            self.warn_once(f"pool:{name}", "kvcr_policy: pool %r misses: %s", name, reason)
        return binding

    def warn_once(self, tag: str, message: str, *args: object) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            log.warning(message, *args)

    def memory(self) -> MemoryMap:
        """The memory of every bound pool (what the tensor API's pointers may name)."""
        memory = self._memory
        if memory is None:
            memory = MemoryMap.merged([])
            for binding in list(self.bound.values()):
                memory = memory | binding.memory
            self._memory = memory
        return memory

    def kv_page_bytes(self) -> int | None:
        kv = self.bound.get(KV)
        return kv.page_bytes if kv is not None and kv.page_bytes else None

    def summary(self) -> str:
        """The line SGLang's "pools registered" call logs."""
        kept = ", ".join(f"{n} ({b.summary})" for n, b in self.bound.items())
        refused = "; ".join(f"{n}: {why}" for n, why in self.refused.items())
        return f"kvcr_policy pools: {kept or 'none'}; refused (misses): {refused or 'none'}"
