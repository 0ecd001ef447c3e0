"""kvcr_policy as SGLang's HiCache L3 storage backend (sglang==0.5.23).

SGLang's dynamic loader imports this package and takes ``KVCRPolicyStorage`` from it
(``"module_path": "kvcr_policy.integrations.sglang"``, ``"class_name": "KVCRPolicyStorage"``).
The class is loaded on first use, since it imports SGLang; the modules that need no SGLang
(configuration, pool geometry, prefixes) import without it. The modules, in the order a call
meets them:

- :mod:`.config`: the ``extra_config`` keys (ours, SGLang's), the loader keys for a profile.
- :mod:`.startup`: the configuration loaded with origins naming SGLang's flag; the start log.
- :mod:`.storage`: :class:`KVCRPolicyStorage`, the whole ``HiCacheStorage`` contract; the
  pages a lookup declined are left out of SGLang's writes of them (:mod:`kvcr_policy.declined`).
- :mod:`.pool_set`: the host pools SGLang registered, bound or refused, and their memory.
- :mod:`.bindings`: one host pool bound to the pipeline, by known layout, by its own page
  description, as a logical anchor, or refused with what it lacks.
- :mod:`.pools`: the classes whose layout kvcr_policy models, key namespaces per rank and pool.
- :mod:`.access`: a page reached through SGLang's pointer lists or page tensors;
  :mod:`.memory` checks every pointer against the pool's own tensors.
- :mod:`.staged`: the generic path, a staging buffer between such a pool and the tier.
- :mod:`.tensor_api` and :mod:`.flat`: the tensor (v0) API in tensor and pointer forms.
- :mod:`.flag`: SGLang's extra-config flag read as SGLang reads it (JSON or ``@FILE``);
  :mod:`.cli`: ``kvcr-policy sglang-config``.
- :mod:`.prefix`: the usable prefix of a v2 existence query.
- :mod:`.metrics`: SGLang's ``StorageMetrics`` samples.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .storage import KVCRPolicyStorage

__all__ = ["KVCRPolicyStorage"]

_INSTALL = (
    "On a GPU server, in the kvcr-policy clone: pip install -e '.[sglang]' (or pip install "
    "sglang==0.5.23); on a CPU-only machine, in the clone: bash .ci/install-sglang.sh"
)


def __getattr__(name: str) -> Any:
    if name != "KVCRPolicyStorage":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from .storage import KVCRPolicyStorage
    except ImportError as err:
        if not (err.name or "").startswith("sglang"):
            raise
        message = f"kvcr_policy.integrations.sglang.KVCRPolicyStorage needs SGLang 0.5.23 ({err}). "
        raise ImportError(message + _INSTALL) from err
    return KVCRPolicyStorage
