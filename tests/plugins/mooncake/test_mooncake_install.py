"""``.ci/install-mooncake.sh`` is idempotent: with everything installed it only probes."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.plugins.mooncake.mooncake_helpers import need_mooncake
from tests.support.paths import ROOT


def test_the_install_script_only_probes_when_everything_is_there() -> None:
    need_mooncake()
    start = time.monotonic()
    done = subprocess.run(
        ["bash", ".ci/install-mooncake.sh"],
        cwd=ROOT,
        env={"PYTHON": sys.executable, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "already installed" in done.stdout
    assert time.monotonic() - start < 60
