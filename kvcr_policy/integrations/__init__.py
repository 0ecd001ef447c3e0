"""Integrations of kvcr_policy with inference engines.

``kvcr_policy.integrations.sglang`` is the HiCache L3 storage backend for SGLang 0.5.23; it
imports SGLang when imported, so nothing here imports it eagerly. ``sglang_config`` and
``sglang_pools`` hold the parts that need no SGLang (extra_config parsing, pool geometry and key
namespaces) and are tested without it.
"""

from __future__ import annotations

__all__: list[str] = []
