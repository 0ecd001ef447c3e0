"""The pipeline of a worker, for the scheduler of the same engine in the same process.

Under vLLM's ``uni`` executor at one rank the scheduler and the worker live in one process, so
the scheduler's lookups ask the worker's own pipeline (its private ``dram`` tier included);
keyed by vLLM's ``engine_id``, so two engines in one process never see each other's pages.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["publish", "published", "withdraw"]

_PIPELINES: dict[str, Any] = {}
_LOCK = threading.Lock()


def publish(engine_id: str, pipeline: Any) -> None:
    with _LOCK:
        _PIPELINES[engine_id] = pipeline


def published(engine_id: str) -> Any | None:
    with _LOCK:
        return _PIPELINES.get(engine_id)


def withdraw(engine_id: str, pipeline: Any) -> None:
    with _LOCK:
        if _PIPELINES.get(engine_id) is pipeline:
            del _PIPELINES[engine_id]
