"""Every install line of the documentation works from a clone in a fresh environment: the project
is not on a package index, so it is installed from the clone (``-e .``, ``-e '.[docs]'``, a
plugin's folder), every extra it names exists, and torch is pinned to ``torch==2.13.0`` as the
README's quick start pins it (any other spec may pull a multi-GB CUDA build). The one exception
is the SGLang extra for a GPU server: sglang==0.5.23 pins its own CUDA torch, and the line says
so."""

from __future__ import annotations

import re
import shlex
import sys

from tests.docs.commands import prose_spans
from tests.docs.snippets import documents, snippets
from tests.support.paths import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PIN = "torch==2.13.0"


def _install_lines() -> list[tuple[str, str]]:
    lines: list[tuple[str, str]] = []
    for page in documents():
        for snippet in snippets(page):
            if snippet.language == "bash":
                lines += [(snippet.where, line) for line in snippet.code.splitlines()]
        lines += prose_spans(page)
    found = []
    for where, text in lines:
        for part in re.split(r"&&|;", text.split(" #", 1)[0]):
            if re.search(r"\bpip install\b", part):
                found.append(
                    (
                        where,
                        f"{part.strip()}{' #' + text.split(' #', 1)[1] if ' #' in text else ''}",
                    )
                )
    return found


def _extras(folder: str) -> set[str]:
    data = tomllib.loads((ROOT / folder / "pyproject.toml").read_text(encoding="utf-8"))
    return set(data["project"].get("optional-dependencies", {}))


def _ours(words: list[str]) -> list[str]:
    """The targets of one ``pip install`` that are this project or its plugins."""
    targets = [w for w in words if not w.startswith("-") and "==" not in w]
    return [t for t in targets if t.startswith((".", "plugins/", "kvcr-policy"))]


def test_the_docs_show_install_lines() -> None:
    assert len(_install_lines()) >= 10


def test_every_install_of_the_project_is_from_the_clone_pins_torch_and_names_real_extras() -> None:
    problems = []
    for where, line in _install_lines():
        command, _, comment = line.partition(" #")
        words = shlex.split(command)
        ours = _ours(words)
        if not ours:
            continue  # another tool (py-spy, sglang's own script)
        for target in ours:
            if target.startswith("kvcr-policy"):
                problems.append(f"{where}: {target} is not on a package index; install the clone")
                continue
            folder, _, extra = target.partition("[")
            folder = "." if folder in (".", "") else folder
            for name in filter(None, extra.rstrip("]").split(",")):
                if name not in _extras(folder):
                    problems.append(f"{where}: no extra {name!r} in {folder}/pyproject.toml")
        sglang = any(t.endswith("[sglang]") for t in ours)
        if PIN not in words and not (sglang and "torch" in comment):
            problems.append(f"{where}: pin {PIN} as the README does: {line}")
    assert not problems, "\n".join(problems)


def test_the_getting_started_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "getting-started.md" in nav
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = next(s for s in snippets(ROOT / "README.md") if "kvcr-policy bench" in s.code)
    assert quick.code in page, "the README's two quick-start commands, as written"
    diagram = next(s for s in snippets(ROOT / "README.md") if "engine process" in s.code)
    assert diagram.code in page, "the README's diagram of how pages move"
    assert "getting-started.md" in readme


def test_no_message_of_the_code_names_an_install_that_cannot_work() -> None:
    """The install hints of error messages (missing matplotlib, ucxx, SGLang, vLLM) install
    from the clone too: ``pip install 'kvcr-policy[x]'`` finds nothing on an index."""
    code = [*(ROOT / "kvcr_policy").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]
    found = [f"{path.relative_to(ROOT)}:{number}" for path in code
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"install '?kvcr-policy(-\w+)?\[", line)]  # fmt: skip
    assert not found, found
