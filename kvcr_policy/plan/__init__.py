"""``kvcr-policy plan``: sizing and restore figures for a deployment, before it exists.

:func:`build_request` gathers the inputs with their origins, :func:`make_plan` works out the
figures with the objects a pipeline would use, :func:`plan_table` shows them.
"""

from .figures import Given, Plan, PlanRequest, make_plan
from .report import plan_table
from .request import build_request

__all__ = ["Given", "Plan", "PlanRequest", "build_request", "make_plan", "plan_table"]
