"""A conformance suite for tier backends: run it against your own backend to prove it honours
the seam (docs/plugins.md, "Prove your backend").

``check_backend(factory)`` runs every check; ``CHECKS`` holds them by name, one test each::

    import pytest
    from kvcr_policy.testing import CHECKS, pipeline_factory

    factory = pipeline_factory({"backend.name": "dict", "backend.options.capacity_pages": 16})

    @pytest.mark.parametrize("check", CHECKS.values(), ids=list(CHECKS))
    def test_conformance(check):
        check(factory)

A factory takes configuration values (``{"batching.read_batch_pages": 2}``, ...) and returns a
new :class:`~kvcr_policy.pipeline.Pipeline` on the backend with them; its tier must hold at least
:data:`SLOTS` pages of the suite's pool (3 layers, 2 heads of 16 float16 values, 4 tokens a page).
The checks move that pool through the real pipeline: keys, partial hits (the leading run), claims
(a page being read is never evicted), close, injected faults (failed batches fall back page by
page), bad input and byte-exactness. A check that fails raises :class:`ConformanceError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config.loading import load_config
from ..errors import ConformanceError
from ..pipeline import Pipeline, build_pipeline
from .checks import CHECKS, Factory
from .pools import SLOTS

__all__ = ["CHECKS", "SLOTS", "ConformanceError", "Factory", "check_backend", "pipeline_factory"]


def pipeline_factory(
    values: Mapping[str, Any], *, profile: str = "default", environ: Mapping[str, str] | None = None
) -> Factory:
    """A factory of pipelines loaded from ``profile`` with ``values`` (which name the backend
    and size its tier) and each check's own values over them; ``environ`` as the process's
    environment (default: none, so that nothing of this shell's leaks in)."""

    def build(overrides: Mapping[str, Any]) -> Pipeline:
        loaded = load_config(
            profile, environ=dict(environ or {}), overrides={**values, **overrides}
        )
        return build_pipeline(loaded)

    return build


def check_backend(factory: Factory, *, only: tuple[str, ...] | None = None) -> None:
    """Every check (or those named in ``only``) on the backend ``factory`` builds, in order;
    raises :class:`ConformanceError` listing each check that failed and why."""
    failed: list[str] = []
    for name, check in CHECKS.items():
        if only is not None and name not in only:
            continue
        try:
            check(factory)
        except ConformanceError as err:
            failed.append(f"{name}: {err}")
    if failed:
        raise ConformanceError("the backend broke the seam's contract:\n" + "\n".join(failed))
