"""Shared fixtures of the test suite, its Hypothesis profiles and its stateful tally.

Hypothesis profiles (registered here only), chosen by ``HYPOTHESIS_PROFILE`` (not a
``KVCR_POLICY_*`` name: those are configuration, and an unknown one is an error):

- ``ci`` (the default, and what ``.ci/run`` exports): more examples than Hypothesis's 100, no
  deadline (a shared 2-core machine stalls at random), every state machine at full length;
- ``dev``: a quick pass while editing (``HYPOTHESIS_PROFILE=dev python -m pytest -x tests/...``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from kvcr_policy.plugins import make_plugin_manager
from kvcr_policy.registry import Registry
from tests.support import stateful
from tests.support.commands import run_main
from tests.support.installs import missing

PROFILE_ENV = "HYPOTHESIS_PROFILE"
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=15, deadline=None)
settings.load_profile(os.environ.get(PROFILE_ENV) or "ci")


def pytest_report_header() -> str:
    return f"hypothesis profile: {settings.get_current_profile_name()} (set {PROFILE_ENV})"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a pytest-xdist worker: hand this process's tally to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["stateful"] = [dict(stateful.SEQUENCES), dict(stateful.MISMATCHES)]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """In the pytest-xdist controller: add a finished worker's tally to the totals."""
    sequences, mismatches = getattr(node, "workeroutput", {}).get("stateful", [{}, {}])
    stateful.SEQUENCES.update(sequences)
    stateful.MISMATCHES.update(mismatches)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line a CI log can be checked for: stateful sequences run and byte mismatches."""
    counts = stateful.SEQUENCES
    if not counts:
        return
    parts = ", ".join(f"{name} {n}" for name, n in sorted(counts.items()))
    mismatches = sum(stateful.MISMATCHES.values())
    terminalreporter.write_line(
        f"stateful sequences: {sum(counts.values())} ({parts}), byte mismatches: {mismatches}"
    )


# Peer secrets: `kvcr-policy serve` creates one in $XDG_CONFIG_HOME/kvcr-policy/peer.secret when
# none is configured, and clients of the same user read it there. The suite's servers and
# clients (and the processes they start) share a private folder instead of the user's own.
_CONFIG_HOME = tempfile.mkdtemp(prefix="kvcr-policy-tests-")
os.environ["XDG_CONFIG_HOME"] = _CONFIG_HOME
# Host tiers (backend 'host', which SGLang's 'auto' picks at TP > 1) that tests start without
# naming a folder live here, not in the user's runtime folder; each worker stops its own.
_RUNTIME_DIR = tempfile.mkdtemp(prefix="kvcr-policy-run-")
os.environ["XDG_RUNTIME_DIR"] = _RUNTIME_DIR


@pytest.fixture(scope="session", autouse=True)
def _stop_host_tiers() -> Iterator[None]:
    """Every host tier a test started in the suite's runtime folder is stopped at the end."""
    yield
    from tests.support.host_tiers import stop_host_tiers

    stop_host_tiers(Path(_RUNTIME_DIR))


EXAMPLE_DIST = "kvcr-policy-example"
EXAMPLE_MISSING = (
    f"{EXAMPLE_DIST} is not installed; run `pip install -e plugins/kvcr-policy-example` "
    "(.ci/run does)"
)


KVCR_DIST = "kvcr-policy-kvcr"


def kvcr_missing() -> str | None:
    """Why the ``kvcr`` backend cannot run here (its plugin or the runner is not installed)."""
    try:
        metadata.distribution(KVCR_DIST)
    except metadata.PackageNotFoundError:
        return (
            f"{KVCR_DIST} is not installed; run `pip install -e plugins/kvcr-policy-kvcr` "
            "(.ci/run does; it pulls kvcr==0.1.1 and nixl)"
        )
    try:
        import kvcr.api  # noqa: F401
    except Exception as err:  # a broken native install is missing too
        return f"kvcr cannot be imported ({err}); pip install kvcr==0.1.1"
    return None


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


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """``cli(*argv)``: ``kvcr_policy.cli.main(argv)`` in-process; (exit status, stdout, stderr)."""
    return lambda *argv: run_main(capsys, *argv)


@pytest.fixture(scope="session")
def registry() -> Registry:
    """One registry of every installed plugin, shared so that many loads stay fast."""
    return make_plugin_manager(environ={}).registry


@pytest.fixture
def example_plugin() -> None:
    """Skip the test unless the example plugin is installed."""
    if not example_installed():
        missing(EXAMPLE_MISSING)


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
