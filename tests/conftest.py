"""Shared fixtures of the test suite."""

from __future__ import annotations

import os
import sys
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


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """Install a throw-away distribution: ``fake_dist(dist, entry_points, modules)``."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    modules: list[str] = []

    def make(dist: str, entry_points: dict[str, str], sources: dict[str, str]) -> None:
        info = root / f"{dist.replace('-', '_')}-1.2.3.dist-info"
        info.mkdir()
        meta = f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.2.3\n"
        (info / "METADATA").write_text(meta, encoding="utf-8")
        lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
        (info / "entry_points.txt").write_text(f"[kvcr_policy]\n{lines}", encoding="utf-8")
        for module, source in sources.items():
            (root / f"{module}.py").write_text(textwrap.dedent(source), encoding="utf-8")
            modules.append(module)

    yield make
    for module in modules:
        sys.modules.pop(module, None)
