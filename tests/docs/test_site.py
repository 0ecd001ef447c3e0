"""The documentation site builds with ``mkdocs build --strict`` (what CI checks: a broken link,
a page missing from the navigation or a plugin README that is no longer where its page includes
it fails the build), and the plugins' pages carry their READMEs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT, child_env


def test_the_site_builds_strictly_with_every_page(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        cwd=ROOT, env=child_env(NO_MKDOCS_2_WARNING="1"), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    pages = {path.stem for path in (ROOT / "docs").glob("*.md")} - {"index"}
    built = {path.parent.name for path in site.glob("*/index.html")}
    assert pages <= built, pages - built
    for page, plugin in (("kvcr", "kvcr-policy-kvcr"), ("mooncake", "kvcr-policy-mooncake")):
        readme = (ROOT / "plugins" / plugin / "README.md").read_text(encoding="utf-8")
        title = readme.splitlines()[0].removeprefix("# ")
        html = (site / page / "index.html").read_text(encoding="utf-8")
        last = [line for line in readme.splitlines() if line.startswith("## ")][-1]
        assert title in html and last.removeprefix("## ").split(" (")[0] in html, (page, last)
