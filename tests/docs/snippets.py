"""The fenced snippets of the documentation (README.md, docs/**/*.md, plugins/*/README.md), each
with the marker written before it, and how each is run or parsed.

A snippet runs as written unless the line before its fence says otherwise:

- ``<!-- snippet: skip REASON: why -->``: it cannot run here; REASON is one of :data:`REASONS`.
  It is still parsed (``bash -n``, ``compile``, TOML, YAML, JSON).
- ``<!-- snippet: serve -->``: a server; it is started in the background, its first stdout line
  awaited, and stopped (by its PID) after the page's last snippet.

What the runner changes, and nothing else: a scratch working directory that links the
repository's top-level entries (so ``data/``, ``.ci/`` and ``tests/`` resolve and written files
land in the scratch), ``HOME`` in the scratch (``~/.config`` too), ``/etc/kvcr`` in the scratch,
the example address ``10.0.0.5`` as ``127.0.0.1``, and port 7480 as a free port.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml  # mkdocs' dependency, installed with the test extras

from tests.support.paths import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project's own fallback (kvcr_policy/config/profiles.py)
    import tomli as tomllib

#: Why a snippet may be left unrun: each names something this machine or a test run lacks.
REASONS = ("gpu", "several hosts", "long", "tested", "fragment", "install")
LANGUAGES = ("bash", "python", "toml", "yaml", "json", "text")
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARK = re.compile(r"^\s*<!-- snippet: (skip (?P<reason>[a-z ]+?)(: .*)?|(?P<serve>serve)) -->$")


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    skip: str | None  # the reason, when it is not run
    serve: bool
    note: str  # the marker's text after the reason ("" when unmarked)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def documents() -> list[Path]:
    """Every page whose snippets the suite checks."""
    docs = sorted((ROOT / "docs").rglob("*.md"))
    return [ROOT / "README.md", *docs, *sorted((ROOT / "plugins").glob("*/README.md"))]


def snippets(path: Path) -> list[Snippet]:
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Snippet] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, language = opening.groups()
        end = index + 1
        while lines[end].strip() != "```":
            end += 1
        code = "\n".join(line[len(indent) :] for line in lines[index + 1 : end]) + "\n"
        before = next((line for line in reversed(lines[:index]) if line.strip()), "")
        mark = _MARK.match(before)
        if "snippet:" in before and not mark:
            raise AssertionError(f"{path}:{index}: a snippet marker that does not parse: {before}")
        skip = mark.group("reason") if mark and mark.group("reason") else None
        serve = bool(mark and mark.group("serve"))
        note = (mark.group(3) or "").removeprefix(": ") if mark else ""
        found.append(Snippet(path, index + 1, language, code, skip, serve, note))
        index = end + 1
    return found


def parse_problem(snippet: Snippet) -> str | None:
    """Why the snippet does not even parse, or None."""
    code = snippet.code
    try:
        if snippet.language == "bash":
            done = subprocess.run(["bash", "-n"], input=code, capture_output=True, text=True)
            return done.stderr.strip() or None if done.returncode else None
        if snippet.language == "python":
            compile(code, snippet.where, "exec")
        elif snippet.language == "toml":
            tomllib.loads(code)
        elif snippet.language == "yaml":
            yaml.safe_load(code)
        elif snippet.language == "json":
            json.loads(code)
    except (SyntaxError, tomllib.TOMLDecodeError, yaml.YAMLError, ValueError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def command(snippet: Snippet, code: str, scratch: Path) -> list[str]:
    """How to run a snippet (bash and Python run; the other languages are parsed only)."""
    if snippet.language == "python":
        script = scratch / f"snippet_{snippet.line}.py"
        script.write_text(code, encoding="utf-8")
        return [sys.executable, str(script)]
    return ["bash", "-euo", "pipefail", "-c", code]


def rewrite(code: str, scratch: Path, port: int) -> str:
    """The runner's stated substitutions (module docstring)."""
    code = code.replace("/etc/kvcr", str(scratch / "etc" / "kvcr"))
    return code.replace("10.0.0.5", "127.0.0.1").replace("7480", str(port))


def scratch_folder(scratch: Path) -> None:
    """Link the repository's top-level entries into the scratch working directory."""
    for entry in ROOT.iterdir():
        if entry.name not in {".git", "docs"} and not (scratch / entry.name).exists():
            (scratch / entry.name).symlink_to(entry)
    (scratch / "home").mkdir()
