"""NIXL's own log level: errors only where NIXL first loads, unless
``observability.native_logs`` or the environment says otherwise (a child process each: the
level is read when NIXL loads)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import child_env

LOAD = """
import logging, os, sys
from kvcr_policy_kvcr.agent import load_nixl
load_nixl(sys.argv[1] == "on")
print(os.environ.get("NIXL_LOG_LEVEL"), logging.getLogger("nixl").getEffectiveLevel())
"""


@pytest.mark.parametrize(
    ("native", "environ", "expected"),
    [
        ("off", {}, "ERROR 40"),  # errors only
        ("on", {}, "None 30"),  # NIXL's records reach the application's logging (WARNING)
        ("off", {"NIXL_LOG_LEVEL": "INFO"}, "INFO 20"),  # the environment wins
    ],
)
def test_nixl_logs_errors_only_unless_native_logs(
    native: str, environ: dict[str, str], expected: str
) -> None:
    pytest.importorskip("nixl")
    done = subprocess.run(
        [sys.executable, "-c", LOAD, native],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(drop=("NIXL_LOG_LEVEL",), **environ),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == expected
