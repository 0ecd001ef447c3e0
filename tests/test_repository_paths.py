"""Nothing in the code, tests or docs names a path outside the repository: a file is read from
the repository or from the user's own arguments, so everything runs on a machine that has only
a clone."""

from __future__ import annotations

import re

from tests.support.paths import ROOT

#: Absolute or parent paths that only one machine has.
OUTSIDE = re.compile(r"(?<![\w.])(/work/|/home/\w|\.\./shared\b|\.\./\.\./)")
FOLDERS = ("kvcr_policy", "tests", "docs", "plugins", ".ci", "profiles", "data")
SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".json", ".txt", ".cfg", ""}


def test_no_file_names_a_path_outside_the_repository() -> None:
    files = [ROOT / "README.md", ROOT / "mkdocs.yml", ROOT / "pyproject.toml"]
    for folder in FOLDERS:
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    found = []
    for path in files:
        if path == ROOT / "tests" / "test_repository_paths.py":
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "read these from the repository or an argument:\n" + "\n".join(found)
