"""Helpers of the peer tests: the server, its settings, and pools big enough to kill mid-read.

Small pools, their pages and fresh keys come from :mod:`tests.support.pools`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

import pytest

from kvcr_policy import load_config
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.schema import PolicyConfig
from tests.support.installs import missing
from tests.support.processes import next_line

SERVER_SETS = {
    "transport.name": "ucx",
    "transport.op_timeout_s": 10,
    "placement.capacity_bytes": "256MiB",
    "transport.options.heartbeat_s": 0.5,
}


def need_ucxx() -> None:
    try:
        import ucxx  # noqa: F401
    except Exception as err:  # ImportError, or a broken native library
        missing(f"ucxx cannot be imported ({err}); pip install 'kvcr-policy[ucx]'")


def promised_s(config: PolicyConfig) -> float:
    """How long docs/peer.md gives a side loaded with ``config`` to settle a fault (a peer killed
    or stopped mid-transfer): ``transport.op_timeout_s``, plus one ``heartbeat_s`` of slack for
    a worker loop that a busy host ran late. That slack is a third of what the peers themselves
    tolerate: a peer is declared dead after three silent heartbeats (and a second)."""
    return config.transport.op_timeout_s + float(config.transport.options["heartbeat_s"])


def server_config(sets: Mapping[str, object] = SERVER_SETS) -> PolicyConfig:
    """The configuration a server started with ``--set`` ``sets`` runs with."""
    return load_config(overrides=dict(sets), environ={}).config


def big_geometry(name: str) -> PoolGeometry:
    """layer_first, 32 fragments of 64 KiB per page (2 MiB pages): the default profile sends
    4,096 messages for 128 pages, a read that lasts long enough to be caught in flight."""
    return PoolGeometry(
        name=name,
        layout="layer_first",
        layers=16,
        heads=8,
        head_dim=128,
        dtype="float16",
        page_size=32,
        tokens=32 * 256,
    )


class Serve:
    """``kvcr-policy serve`` as a child process, driven only through its command line: the one
    JSON line it prints on start, its log on stderr, and SIGTERM."""

    def __init__(
        self,
        sets: Mapping[str, object],
        *,
        listen: str | None = "127.0.0.1:0",
        args: Sequence[str] = (),
        python: Sequence[str] = ("-m", "kvcr_policy"),
        timeout: float = 60.0,
    ) -> None:
        command = [sys.executable, *python, "serve", *args]
        if listen is not None:
            command += ["--listen", listen]
        for key, value in sets.items():
            command += ["--set", f"{key}={value}"]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.log: list[str] = []
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        try:
            first = next_line(self.proc, timeout=timeout)
        except pytest.fail.Exception as err:
            self.proc.kill()
            self.proc.wait()
            self._drainer.join(5.0)  # the child's last words explain why it did not start
            tail = "\n".join(self.log[-20:])
            raise AssertionError(f"kvcr-policy serve did not start: {err}\n{tail}") from None
        self.info: dict[str, object] = json.loads(first)
        self.address = str(self.info["listening"])
        self.port = int(self.address.rsplit(":", 1)[1])
        # The rest of stdout is drained too, so the child never blocks on a full pipe.
        self._stdout = threading.Thread(target=self._drain_stdout, daemon=True)
        self._stdout.start()

    def _drain_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append("stdout: " + line.rstrip())

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then the exit code (SIGKILL if it overstays ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._drainer.join(10)
        return code
