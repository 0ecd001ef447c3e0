"""No import cycle among the modules of the core or of any plugin, imports made only for type
checking included (import-linter's contracts count them too: ``exclude_type_checking_imports =
false``; this test holds every module, not only a package's direct children)."""

from __future__ import annotations

import grimp
import pytest

PACKAGES = ("kvcr_policy", "kvcr_policy_kvcr", "kvcr_policy_mooncake", "kvcr_policy_example")


def _edges(package: str) -> dict[str, set[str]]:
    """Module -> the modules it imports, within ``package``; an import of the package's face
    (which re-exports) or of a module's own enclosing package is no edge."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=False)
    return {
        module: {
            imported
            for imported in graph.find_modules_directly_imported_by(module)
            if imported != package and not module.startswith(imported + ".")
        }
        for module in graph.modules
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_cycles_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    found = cycles(_edges(package))
    assert not found, (
        f"{package}: import cycles (type-only imports count: import a small Protocol from a "
        f"module below both instead): {found}"
    )
