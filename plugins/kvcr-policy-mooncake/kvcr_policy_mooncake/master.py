"""MasterProcess: a ``mooncake_master`` on free ports, for tests and benchmarks.

Started with the binary the ``mooncake`` package ships (the console script of the same name
execs it, so the PID is the master's), ready once ``GET /health`` on its metrics port answers,
and stopped by PID: SIGTERM, then SIGKILL if it overstays. :meth:`MasterProcess.kill` is the
crash a test inflicts (SIGKILL) and :meth:`MasterProcess.start` brings it back on the same
ports; ``tenants`` starts one that enforces tenants (:class:`MasterProcess`). Started from the
main thread, the master is told to die with the process that started it
(``PR_SET_PDEATHSIG``), so a crashed test run leaves no master behind; the kernel ties that
signal to the starting *thread*, so from any other thread it is not asked for.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from kvcr_policy.plugin_api import TransportError

__all__ = ["MasterProcess", "child_setup", "free_port", "master_binary", "tenant_policy"]

_PR_SET_PDEATHSIG = 1  # prctl(2)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def master_binary() -> str:
    """The ``mooncake_master`` executable of the installed ``mooncake`` package."""
    spec = find_spec("mooncake")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "mooncake_master"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("mooncake_master")
    if found is None:
        message = (
            "mooncake_master is not installed: pip install "
            "mooncake-transfer-engine-non-cuda==0.3.13.post1 (bash .ci/install-mooncake.sh)"
        )
        raise TransportError(message)
    return found


# Looked up before any fork: the child of a threaded process must not load libraries.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def child_setup() -> Any:
    """``preexec_fn`` for a child that should die with this process, or None where the
    calling thread is not the main one (the signal would fire when that thread ends)."""
    return _die_with_parent if threading.current_thread() is threading.main_thread() else None


def tenant_policy(tenants: Mapping[str, int]) -> str:
    """The tenant quota policy file of a master that enforces tenants: each tenant's name and
    quota in bytes, as the master's file connector reads it (names as JSON strings, which YAML
    reads as they are)."""
    lines = ["version: 1", "tenants:" if tenants else "tenants: []"]
    for name, quota in tenants.items():
        if not 0 < quota < 1 << 63:
            raise ValueError(f"tenant {name!r}: a quota is 1..2**63-1 bytes, got {quota}")
        lines += [f"  - name: {json.dumps(name)}", f"    quota: {int(quota)}"]
    return "\n".join(lines) + "\n"


class MasterProcess:
    """See the module docstring; ``args`` are extra master flags (``--client_ttl=2``).

    With ``tenants`` (name -> quota in bytes) the master enforces them: started with
    ``--enable_multi_tenants=true`` and a tenant quota policy file (:func:`tenant_policy`), it
    keeps each tenant's objects in a namespace of its own (a ``get``, ``exists`` or
    ``remove_by_regex`` sees only the caller's tenant) and refuses a put of a tenant the
    policy does not name (``TENANT_NOT_REGISTERED``) or past its quota.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        args: Sequence[str] = (),
        *,
        timeout: float = 30.0,
        tenants: Mapping[str, int] | None = None,
    ) -> None:
        self.host = host
        self.args = tuple(args)
        self.rpc_port = free_port(host)
        self.metrics_port = free_port(host)
        self.log_path = Path(tempfile.mkstemp(prefix="kvcr-mooncake-master-", suffix=".log")[1])
        self.policy_path: Path | None = None
        if tenants is not None:
            fd, name = tempfile.mkstemp(prefix="kvcr-mooncake-tenants-", suffix=".yaml")
            with os.fdopen(fd, "w", encoding="utf-8") as policy:  # mode 0600 (mkstemp)
                policy.write(tenant_policy(tenants))
            self.policy_path = Path(name)
            self.args += (
                "--enable_multi_tenants=true",
                "--tenant_quota_connector_type=file",
                f"--tenant_quota_connector_uri={name}",
            )
        self.proc: subprocess.Popen[bytes] | None = None
        self.start(timeout)

    @property
    def address(self) -> str:
        """HOST:PORT of the RPC service: what ``backend.options.master`` names."""
        return f"{self.host}:{self.rpc_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout: float = 30.0) -> None:
        """Start (or restart) on the same ports; return once ``/health`` answers."""
        if self.proc is not None and self.proc.poll() is None:
            return
        command = [
            master_binary(),
            f"--rpc_address={self.host}",
            f"--rpc_port={self.rpc_port}",
            f"--metrics_host={self.host}",
            f"--metrics_port={self.metrics_port}",
            *self.args,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=child_setup()
            )
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        url = f"http://{self.host}:{self.metrics_port}/health"
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                message = (
                    f"mooncake_master exited with code {self.proc.returncode} at start:\n"
                    + self.log_tail()
                )
                raise TransportError(message)
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1.0) as reply:
                if b'"service_ready":true' in reply.read():
                    return
            time.sleep(0.05)
        self.stop()
        message = f"mooncake_master did not get ready within {timeout} s:\n{self.log_tail()}"
        raise TransportError(message)

    def metric(self, name: str) -> float | None:
        """The value of the master's metric ``name`` (``GET /metrics``: one series, no labels),
        None when it does not list it."""
        url = f"http://{self.host}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5.0) as reply:
            for line in reply.read().decode("utf-8", "replace").splitlines():
                found, _, value = line.partition(" ")
                if found == name:
                    return float(value)
        return None

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(line for line in text if "Master Admin Metrics" not in line)[-4000:]

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is flushed, every client sees it go."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it overstays; the exit code (None if never started)."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def close(self) -> None:
        """Stop it and remove its log (and its tenant policy)."""
        self.stop()
        for path in (self.log_path, self.policy_path):
            if path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(path)

    def __enter__(self) -> MasterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
