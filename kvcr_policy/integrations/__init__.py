"""Integrations of kvcr_policy with inference engines.

``kvcr_policy.integrations.sglang`` is the HiCache L3 storage backend for SGLang 0.5.23; its
class imports SGLang when first used, and its package docstring maps its modules. Nothing here
imports SGLang eagerly.
"""

from __future__ import annotations

__all__: list[str] = []
