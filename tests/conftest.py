"""Shared fixtures of the test suite."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import pytest

from kvcr_policy.plugins import make_plugin_manager
from kvcr_policy.registry import Registry

EXAMPLE_DIST = "kvcr-policy-example"
EXAMPLE_MISSING = (
    f"{EXAMPLE_DIST} is not installed; run `pip install -e plugins/kvcr-policy-example` "
    "(.ci/run does)"
)


def example_installed() -> bool:
    """Whether the example plugin distribution is installed in this environment."""
    try:
        metadata.distribution(EXAMPLE_DIST)
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No ``KVCR_POLICY_*`` variable of the developer's shell leaks into the test."""
    for name in list(os.environ):
        if name.upper().startswith("KVCR_POLICY_"):
            monkeypatch.delenv(name)
    yield


@pytest.fixture
def write_profile(tmp_path: Path) -> Callable[..., Path]:
    """Write a TOML profile (dedented) under tmp_path and return its path."""

    def write(text: str, name: str = "profile.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    return write


@pytest.fixture(scope="session")
def registry() -> Registry:
    """One registry of every installed plugin, shared so that many loads stay fast."""
    return make_plugin_manager(environ={}).registry


@pytest.fixture
def example_plugin() -> None:
    """Skip the test unless the example plugin is installed."""
    if not example_installed():
        pytest.skip(EXAMPLE_MISSING)
