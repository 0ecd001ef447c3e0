"""kvcr-policy-example: a third-party kvcr_policy plugin registering the ``adaptive`` batching.

kvcr_policy finds this module through the ``kvcr_policy`` entry-point group (name ``example``)
and registers it exactly like its built-in plugins: pluggy collects the ``kvcr_*`` hook
implementations below.
"""

from __future__ import annotations

from .batching import AdaptiveBatching, AdaptiveOptions, kvcr_register_strategies

__all__ = ["AdaptiveBatching", "AdaptiveOptions", "kvcr_register_strategies"]
