"""Integrations of kvcr_policy with inference engines.

``kvcr_policy.integrations.sglang`` is the HiCache L3 storage backend for SGLang 0.5.23;
``kvcr_policy.integrations.vllm`` the KV connector, the offloading tier and the cache policy for
vLLM 0.32. Their classes import the engine when first used, and each package docstring maps its
modules. Nothing here imports an engine eagerly.
"""

from __future__ import annotations

__all__: list[str] = []
