"""check_figure_path: a --plot path is refused before any work when the figure could not be
written there (bench --plot and plan --plot share it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvcr_policy.cli import figure as figure_path
from kvcr_policy.cli.figure import check_figure_path
from kvcr_policy.errors import ArgumentError


def test_a_writable_png_svg_or_pdf_is_accepted(tmp_path: Path) -> None:
    for name in ("curve.png", "curve.svg", "curve.pdf"):
        check_figure_path(str(tmp_path / name))


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("curve", "has no suffix; name a file ending in one of"),
        ("curve.txt", "has suffix '.txt'"),
        ("missing/curve.png", "does not exist"),
        (".", "is a folder"),
    ],
)
def test_a_path_that_cannot_hold_a_figure_is_refused(
    tmp_path: Path, name: str, message: str
) -> None:
    with pytest.raises(ArgumentError, match=message) as caught:
        check_figure_path(str(tmp_path / name), "--plot")
    assert str(caught.value).startswith(f"--plot {tmp_path / name}")


def test_without_matplotlib_the_install_command_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(figure_path, "find_spec", lambda name: None)
    with pytest.raises(
        ArgumentError,
        match=r"needs matplotlib.*torch==2\.13\.0 -e '\.\[plot\]' in the kvcr",
    ):
        check_figure_path(str(tmp_path / "curve.png"))
