"""The declared plugin API: one module exports it, docs/plugins.md lists it, plugins keep to it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kvcr_policy import plugin_api
from tests.support.paths import ROOT

PLUGINS = sorted((ROOT / "plugins").glob("kvcr-policy-*/kvcr_policy_*"))


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every ``kvcr_policy`` module ``path`` imports (TYPE_CHECKING blocks included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] == "kvcr_policy"]
    return found


def test_every_exported_name_resolves() -> None:
    missing = [name for name in plugin_api.__all__ if not hasattr(plugin_api, name)]
    assert missing == []


@pytest.mark.parametrize("package", PLUGINS, ids=lambda p: p.name)
def test_the_plugins_import_only_the_declared_modules(package: Path) -> None:
    outside = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sorted(package.rglob("*.py"))
        for line, module in _imports(path)
        if module not in plugin_api.MODULES
    ]
    assert outside == [], "plugins import only kvcr_policy.plugin_api.MODULES"


def test_a_module_outside_the_api_is_caught(tmp_path: Path) -> None:
    source = tmp_path / "plugin.py"
    source.write_text("from kvcr_policy.backends.dram.store import Store\n", encoding="utf-8")
    assert [m for _, m in _imports(source) if m not in plugin_api.MODULES] == [
        "kvcr_policy.backends.dram.store"
    ]


def test_the_readme_lists_the_modules() -> None:
    text = (ROOT / "docs" / "plugins.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- plugin-api-modules -->(.*?)<!-- /plugin-api-modules -->", text, re.S)
    assert block is not None
    assert tuple(re.findall(r"`([a-z_.]+)`", block.group(1))) == plugin_api.MODULES
