"""``--plot PATH``: a figure file that matplotlib can write, checked before any work starts.

matplotlib picks the format from the suffix, adds ``.png`` to a name without one, and refuses
an unknown one only when it saves, after the whole run; so the path is checked first.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path

from ..errors import ArgumentError

__all__ = ["INSTALL", "check_figure_path"]

INSTALL = "pip install torch==2.13.0 -e '.[plot]' in the kvcr-policy clone"


def check_figure_path(path: str, option: str = "--plot") -> None:
    """Refuse ``option PATH`` (ArgumentError) when the figure could not be written there."""
    if find_spec("matplotlib") is None:
        raise ArgumentError(f"{option} needs matplotlib, which is not installed: {INSTALL}")
    from matplotlib.backend_bases import FigureCanvasBase

    target = Path(path)
    folder = target.parent
    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    suffix = target.suffix.lower().lstrip(".")
    problem = None
    if target.is_dir():
        problem = "is a folder; name a .png file"
    elif suffix not in formats:
        got = f"suffix {target.suffix!r}" if suffix else "no suffix"
        problem = f"has {got}; name a file ending in one of: .{', .'.join(formats)}"
    elif not folder.is_dir():
        problem = f"cannot be written: folder {str(folder)!r} does not exist"
    elif not os.access(folder, os.W_OK | os.X_OK):
        problem = f"cannot be written: folder {str(folder)!r} is not writable"
    elif target.exists() and not os.access(target, os.W_OK):
        problem = "exists and is not writable"
    if problem is not None:
        raise ArgumentError(f"{option} {path}: {problem}")
