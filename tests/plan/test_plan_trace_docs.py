"""Every command of docs/plan.md's section on ``plan --trace`` runs as written (in a scratch
folder that holds the repository's ``data/``, so the figure it draws lands there)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from tests.support.commands import run_main
from tests.support.paths import ROOT

pytestmark = pytest.mark.usefixtures("clean_env")

SECTION = "## Sizing from a workload: `kvcr-policy plan --trace`"


def _commands() -> list[str]:
    text = (ROOT / "docs" / "plan.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("kvcr-policy ")]


def test_the_section_documents_three_commands() -> None:
    assert len(_commands()) == 3


@pytest.mark.parametrize("command", _commands())
def test_each_documented_command_runs(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "data").symlink_to(ROOT / "data")
    (tmp_path / "docs").mkdir()
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)[1:]
    code, out, err = run_main(capsys, *argv)
    assert code == 0, err
    if "--format" in argv:
        assert json.loads(out)["evictions"][0]["eviction"] == "lru"
    if "--plot" in argv:
        drawn = tmp_path / argv[argv.index("--plot") + 1]
        assert drawn.read_bytes().startswith(b"\x89PNG")
        assert (ROOT / argv[argv.index("--plot") + 1]).is_file()  # docs/plan.md shows it
    if "--bytes" in argv:
        assert out.count("agrees with the model") == 4
