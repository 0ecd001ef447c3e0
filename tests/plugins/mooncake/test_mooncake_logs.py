"""Mooncake's own log lines: errors only by default, all of them with
``observability.native_logs = true``. A real client stores and restores pages against a real
``mooncake_master`` in a child process (its library's log level is fixed when it loads), and
its stderr is read."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

from tests.support.paths import child_env

#: A glog line below ERROR: I or W, then MMDD.
QUIET_LEVELS = re.compile(r"^[IW]\d{4} ", re.MULTILINE)

CLIENT = """
import sys
import numpy as np
from tests.plugins.mooncake.mooncake_helpers import GEO, pipeline_on
from tests.support.pools import token_indices

class Master:
    address = sys.argv[1]

extra = {"observability__native_logs": True} if sys.argv[2] == "on" else {}
with pipeline_on(Master(), backend__options__segment_bytes="64MiB", **extra) as pipeline:
    pipeline.register_pool("kv", GEO, np.zeros(GEO.shape, dtype=np.float16))
    keys = [f"log-{i}" for i in range(4)]
    assert pipeline.set(keys, token_indices(range(4), GEO.page_size)) == [True] * 4
    assert pipeline.get(keys, token_indices(range(4, 8), GEO.page_size)) == [True] * 4
print("restored")
"""


def _client_stderr(master: Any, native: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, master.address, native],
        capture_output=True,
        text=True,
        timeout=180,
        env=child_env(drop=("MC_LOG_LEVEL", "KVCR_POLICY_")),
    )
    assert done.returncode == 0 and done.stdout.strip() == "restored", done.stderr[-3000:]
    return done.stderr


def test_mooncake_logs_errors_only_unless_native_logs(master: Any) -> None:
    quiet = _client_stderr(master, "off")
    assert not QUIET_LEVELS.findall(quiet), quiet
    loud = _client_stderr(master, "on")
    assert QUIET_LEVELS.findall(loud), loud  # INFO lines: client metrics, segment mounts
