"""Every ``kvcr-policy`` command line the documentation shows: in its shell snippets (skipped
ones too: a GPU command's flags are still the parser's) and in its prose's code spans.

A line is cut at shell operators (``&&``, ``|``, ``;``, ``(``), continuation backslashes are
joined, and leading ``VAR=value`` assignments are dropped; what follows ``kvcr-policy`` is the
command's argument list, split as the shell would (:func:`shlex.split`).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.docs.snippets import documents, snippets
from tests.support.paths import ROOT

_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_OPERATORS = re.compile(r"&&|\|\||[|;()]")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=\S*$")


@dataclass(frozen=True)
class Documented:
    """One documented command line: where it is, and its arguments after ``kvcr-policy``."""

    where: str
    text: str
    args: tuple[str, ...]
    #: A code span of the prose: it may name a command and an option without a whole line.
    partial: bool = False

    @property
    def placeholders(self) -> bool:
        """Whether it shows a value to fill in (``PATH``, ``<file>``, ``...``, ``$VAR``)."""
        return bool(re.search(r"<[^>]*>|\.\.\.|\$|…|\[-", self.text))


def _lines(code: str) -> list[str]:
    joined = re.sub(r"\\\n\s*", " ", code)
    out: list[str] = []
    for line in joined.split("\n"):
        line = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
        out += [part.strip() for part in _OPERATORS.split(line) if part.strip()]
    return out


def _command(where: str, text: str, partial: bool = False) -> Documented | None:
    try:
        words = shlex.split(text)
    except ValueError:  # an unbalanced quote: the part of a line an operator split
        return None
    while words and _ASSIGNMENT.match(words[0]):
        words = words[1:]
    if words and words[-1] == "&":  # run in the background: the shell's, not an argument
        words = words[:-1]
    if len(words) < 2 or words[0] != "kvcr-policy":
        return None
    # ``[--tp 2]``: an optional part, shown in brackets
    args = tuple(word.strip("[]") if "[-" in text else word for word in words[1:])
    return Documented(where, text, args, partial)


def _prose(path: Path) -> list[tuple[int, str]]:
    """The code spans of a page outside its fenced blocks, with their line numbers."""
    spans: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            spans += [(number, span) for span in _SPAN.findall(line)]
    return spans


def prose_spans(path: Path) -> list[tuple[str, str]]:
    """The code spans of a page's prose, each with where it is (``page:line``)."""
    name = str(path.relative_to(ROOT))
    return [(f"{name}:{number}", span) for number, span in _prose(path)]


def documented_commands() -> list[Documented]:
    """Every ``kvcr-policy ...`` line of README.md, docs/ and the plugins' READMEs."""
    found: list[Documented] = []
    for page in documents():
        name = str(page.relative_to(ROOT))
        for snippet in snippets(page):
            if snippet.language != "bash":
                continue
            for text in _lines(snippet.code):
                command = _command(f"{snippet.where}", text)
                if command is not None:
                    found.append(command)
        for number, span in _prose(page):
            for text in _OPERATORS.split(span):
                command = _command(f"{name}:{number}", text.strip(), partial=True)
                if command is not None:
                    found.append(command)
    return found


def prose_flags() -> list[tuple[str, str]]:
    """Every code span of the prose that is a flag alone (``--output-always``), with where."""
    flags: list[tuple[str, str]] = []
    for page in documents():
        name = str(page.relative_to(ROOT))
        for number, span in _prose(page):
            flag = re.fullmatch(r"(--[a-z][a-z0-9-]*)(?:[ =]\S.*)?", span)
            if flag:
                flags.append((f"{name}:{number}", flag.group(1)))
    return flags
