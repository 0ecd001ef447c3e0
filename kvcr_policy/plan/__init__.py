"""``kvcr-policy plan``: sizing and restore figures for a deployment, before it exists.

For a token count: :func:`build_request` gathers the inputs with their origins,
:func:`make_plan` works out the figures with the objects a pipeline would use,
:func:`plan_table` shows them. For a request trace (``--trace``), one module each:

- :mod:`.trace`: Mooncake's trace format, read and checked line by line;
- :mod:`.replay`: the replay model (the definition of a hit, followed exactly);
- :mod:`.replay_bytes`: the same requests through a real pipeline, checked against the model;
- :mod:`.workload`: the figures per eviction strategy and capacity;
- :mod:`.workload_report` and :mod:`.curve`: the tables and the hit-rate curve;
- :mod:`.command`: the command line behind both.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["Given", "Plan", "PlanRequest", "build_request", "make_plan", "plan_table"]

#: Where each name lives: imported on first use, so that the command line reads the bounds of
#: :mod:`.trace` without importing the figures.
_HOMES = {
    "Given": ".figures",
    "Plan": ".figures",
    "PlanRequest": ".figures",
    "make_plan": ".figures",
    "plan_table": ".report",
    "build_request": ".request",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(name)
    return getattr(import_module(_HOMES[name], __name__), name)
