"""What one benchmark run is asked to do: :class:`BenchSetup`, and :class:`BenchError`.

Both are defined where plugins' bench adapters see them (:mod:`kvcr_policy.bench_adapter`,
:mod:`kvcr_policy.errors`); this module keeps the names bench has always used.
"""

from __future__ import annotations

from ..bench_adapter import BenchSetup
from ..errors import BenchError

__all__ = ["BenchError", "BenchSetup"]
