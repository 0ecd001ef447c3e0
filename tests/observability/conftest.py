"""Fixtures of the metrics tests: a real /metrics endpoint and a scrape over HTTP.

Pipelines record into prometheus-client's default registry, shared by the whole test session,
so each test selects its own series by a ``profile`` label no other test uses (a profile file
with a unique name).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvcr_policy.observability.exposition import MetricsServer, serve_metrics
from tests.observability.scraping import Samples, read_samples


@pytest.fixture(scope="session")
def metrics_server() -> Iterator[MetricsServer]:
    """/metrics of the default registry on a loopback port of its own."""
    server = serve_metrics("127.0.0.1:0")
    yield server
    server.close()


@pytest.fixture
def scrape(metrics_server: MetricsServer) -> Callable[[str], Samples]:
    """``scrape(profile)``: the samples of one profile label, read over real HTTP."""
    return lambda profile: read_samples(metrics_server.url, profile)


@pytest.fixture
def unique_profile(tmp_path: Path) -> Callable[[str], Path]:
    """``unique_profile(toml)``: a profile file whose name no other test's metrics carry."""

    def write(text: str = "") -> Path:
        path = tmp_path / f"m{uuid.uuid4().hex[:10]}.toml"
        path.write_text(text, encoding="utf-8")
        return path

    return write
