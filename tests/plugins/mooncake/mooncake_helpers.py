"""What the Mooncake tests share: whether Mooncake and the plugin are installed.

No test module may live directly in ``tests/plugins/``: pytest would put that folder on
``sys.path``, and Mooncake's package extends its ``__path__`` over every ``mooncake`` folder it
finds there (this one included).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
from importlib import metadata
from typing import Any

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.pipeline import Pipeline
from tests.support.installs import missing
from tests.support.paths import ROOT

__all__ = [
    "GEO",
    "PLUGIN_DIST",
    "ClientProcess",
    "mooncake_problem",
    "need_mooncake",
    "pipeline_on",
]


PLUGIN_DIST = "kvcr-policy-mooncake"
INSTALL = (
    "run `bash .ci/install-mooncake.sh` and `pip install -e plugins/kvcr-policy-mooncake` "
    "(.ci/run does)"
)


def mooncake_problem() -> str | None:
    """Why the Mooncake tests cannot run here, or None when they can."""
    try:
        metadata.distribution(PLUGIN_DIST)
    except metadata.PackageNotFoundError:
        return f"{PLUGIN_DIST} is not installed; {INSTALL}"
    try:
        import mooncake.store  # noqa: F401
    except ImportError as err:
        return f"mooncake cannot be imported ({err}); {INSTALL}"
    return None


def need_mooncake() -> None:
    """Skip the test where Mooncake cannot be imported; fail instead under CI."""
    problem = mooncake_problem()
    if problem is not None:
        missing(problem)


class ClientProcess:
    """``python -m tests.plugins.mooncake.sglang_client`` as a child (inside network namespace
    ``netns`` when given), stopped by PID; :meth:`ask` sends one command and reads its reply."""

    def __init__(self, netns: str | None = None, timeout: float = 180.0) -> None:
        command = [sys.executable, "-m", "tests.plugins.mooncake.sglang_client"]
        if netns is not None:
            command = ["ip", "netns", "exec", netns, *command]
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        assert self._read(timeout) == {"ready": True}

    def _read(self, timeout: float) -> dict[str, Any]:
        line: list[str] = []
        reader = threading.Thread(
            target=lambda: line.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(timeout)
        if not line or not line[0]:
            self.kill()
            raise AssertionError(f"the client process gave no reply in {timeout} s:\n{self.log()}")
        reply: dict[str, Any] = json.loads(line[0])
        return reply

    def ask(self, op: str, timeout: float = 180.0, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        reply = self._read(timeout)
        if "error" in reply:
            raise AssertionError(
                f"{op} failed in the client process: {reply['error']}\n{self.log()}"
            )
        return reply

    def log(self, lines: int = 40) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace").splitlines()
        return "\n".join(line for line in text if line[:1] not in "IW" or "Error" in line)[-6000:]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Ask it to close its backends and exit; kill it if it does not."""
        if self.proc.poll() is None:
            try:
                self.ask("close", timeout=60)
                self.proc.wait(30)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.kill()
        self.stderr.close()


#: 32 KiB pages (2 layers, 4 heads, head dim 64, fp16, 16 tokens), K and V apart (multi-buffer).
GEO = PoolGeometry("kv", "page_first", 2, 4, 64, "float16", 16, 16 * 128)


def pipeline_on(master: Any, **overrides: Any) -> Pipeline:
    values = {
        "backend.name": "mooncake",
        "backend.options.master": master.address,
        "backend.options.segment_bytes": 0,
        "backend.options.recheck_s": 0.2,
        **{key.replace("__", "."): value for key, value in overrides.items()},
    }
    return build_pipeline(load_config(environ={}, overrides=values))
