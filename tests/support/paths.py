"""Where the repository is, and an environment in which a child Python imports this tree.

A child process started by a test (``python -c ...``, a script beside the test) imports
``kvcr_policy`` and ``tests.*`` from the same checkout as the test itself, whatever its working
directory and however the package was installed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ROOT", "child_env"]

#: The repository root (the folder holding ``kvcr_policy/`` and ``tests/``).
ROOT = Path(__file__).resolve().parents[2]


def child_env(
    base: Mapping[str, str] | None = None, *, drop: tuple[str, ...] = (), **extra: str
) -> dict[str, str]:
    """``base`` (the current environment by default) less the variables whose names start with
    one of ``drop``, with :data:`ROOT` first on PYTHONPATH, then ``extra``."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not (drop and k.upper().startswith(drop))}
    paths = [str(ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    return {**env, "PYTHONPATH": os.pathsep.join(paths), **extra}
