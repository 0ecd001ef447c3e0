"""What to do when a test's software is not installed: skip on a developer's machine, fail in CI.

The README's test command installs everything the tests use (SGLang through
``.ci/install-sglang.sh``, ucxx through the ``ucx`` extra, the example and Mooncake plugins, the
Mooncake transfer engine through ``.ci/install-mooncake.sh``), so in CI a missing
install is a broken setup, never a reason to skip: ``.ci/run`` exports ``CI=true`` and these
tests fail instead. Only missing hardware (a GPU) skips everywhere.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

__all__ = ["expected", "missing"]


def expected() -> bool:
    """True where every install is expected: under CI (``CI`` set to anything but false/0)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(reason: str) -> NoReturn:
    """Skip with ``reason``, or fail with it where installs are :func:`expected`."""
    if expected():
        pytest.fail(f"{reason} (CI is set: every test dependency must be installed)")
    pytest.skip(reason)
