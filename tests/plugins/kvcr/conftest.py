"""Fixtures of the ``kvcr`` backend tests: pipelines on the real KVCR runner (kvcr 0.1.1).

Every test here runs KVCR itself: NIXL over UCX on loopback, in this process (next to ucxx, which
other tests load). The tests skip with a reason where the plugin or kvcr is not installed, and
fail under CI, where the README's test command installs both.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.pipeline import Pipeline
from tests.conftest import kvcr_missing
from tests.support.installs import missing


@pytest.fixture(autouse=True)
def _kvcr_installed() -> None:
    reason = kvcr_missing()
    if reason is not None:
        missing(reason)


#: A profile that selects the backend, as a deployment would.
KVCR_PROFILE = """
[backend]
name = "kvcr"
"""


@pytest.fixture
def kvcr_profile(tmp_path: Path) -> Callable[..., Path]:
    """``kvcr_profile(extra_toml="")``: the path of a TOML profile selecting ``kvcr``."""

    def write(extra: str = "", name: str = "kvcr.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(KVCR_PROFILE) + textwrap.dedent(extra), encoding="utf-8")
        return path

    return write


Make = Callable[..., Pipeline]


@pytest.fixture
def kvcr_pipeline(kvcr_profile: Callable[..., Path]) -> Iterator[Make]:
    """``kvcr_pipeline(extra_toml="", profile=None, **overrides)``: a pipeline on ``kvcr``,
    closed after the test. ``profile`` (a bundled name) comes in as overrides under the TOML
    that selects the backend; ``overrides`` use ``__`` for dots. Tiers hold 1 MiB unless
    ``placement__capacity_bytes`` says otherwise."""
    opened: list[Pipeline] = []

    def make(extra: str = "", profile: str | None = None, **overrides: Any) -> Pipeline:
        values: dict[str, Any] = {"placement.capacity_bytes": "1MiB"}  # never 4 GiB here
        if profile is not None:
            named = load_config(profile, environ={}).changed()
            values |= {path: value for path, (value, _) in named.items()}
        values.update({key.replace("__", "."): value for key, value in overrides.items()})
        loaded = load_config(kvcr_profile(extra), environ={}, overrides=values)
        pipeline = build_pipeline(loaded)
        assert pipeline.backend.name == "kvcr"
        opened.append(pipeline)
        return pipeline

    yield make
    for pipeline in opened:
        pipeline.close()
