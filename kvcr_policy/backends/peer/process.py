"""``kvcr-policy serve`` in a child process: the peer backend's server, for its benchmark
adapter (:mod:`.bench`) and for tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kvcr_policy.errors import BenchError

__all__ = ["PeerProcess"]


class PeerProcess:
    """``kvcr-policy serve`` in a child process; ``address`` once it listens."""

    def __init__(
        self,
        sets: Mapping[str, Any],
        *,
        profile: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
        listen: str | None = "127.0.0.1:0",
        args: Sequence[str] = (),
    ) -> None:
        command = [*self.launcher(), "serve", *args]
        if listen is not None:  # None: transport.options.listen decides
            command += ["--listen", listen]
        if profile is not None:
            command += ["--profile", profile]
        for key, value in sets.items():
            command += ["--set", f"{key}={value}"]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.log: list[str] = []
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        line = self._first_line(timeout)
        self.address: str = line["listening"]
        self.info = line
        # Anything after the JSON line is drained too: a pipe nobody reads fills at 64 KiB,
        # and a process writing to it then blocks (UCX logs to stdout unless told otherwise).
        self._stdout = threading.Thread(target=self._drain_stdout, daemon=True)
        self._stdout.start()

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def launcher(self) -> list[str]:
        """The command line before ``serve``: this Python running kvcr_policy's CLI."""
        return [sys.executable, "-m", "kvcr_policy"]

    def _drain_stdout(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append("stdout: " + line.rstrip())

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())

    def _first_line(self, timeout: float) -> dict[str, Any]:
        result: list[str] = []
        reader = threading.Thread(
            target=lambda: result.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
            daemon=True,
        )
        reader.start()
        reader.join(timeout)
        if not result or not result[0]:
            self.proc.kill()
            self.proc.wait()
            self._drainer.join(5.0)  # the child's last words explain why it did not start
            tail = "\n".join(self.log[-20:])
            raise BenchError(f"kvcr-policy serve did not start within {timeout} s:\n{tail}")
        return dict(json.loads(result[0]))

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM, then wait; returns the exit code (killed if it overstays)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._drainer.join(10.0)  # so that the log holds the child's last lines
        return code
