"""The ``host`` backend: one tier per host for every process, started by the first that needs it.

Every rank of a tensor- or pipeline-parallel engine on a host, and every engine instance of the
same user, reaches the same tier: a ``kvcr-policy serve`` that listens only on a Unix socket in
a private folder (``backend.options.dir``, default ``$XDG_RUNTIME_DIR/kvcr-policy``, else
``/tmp/kvcr-policy-UID``, mode 0700) and moves pages through shared memory (the tier's memfd,
mapped by each client: a memory copy, no socket, no UCX). Keys stay apart as the engine names
them (SGLang's MHA shards carry their TP rank; MLA pages, the same on every rank, are shared:
what rank 0 writes, every rank reads), tenants and quotas as on any ``serve``.

Who starts it: the first process that finds nobody listening takes an exclusive ``flock`` of
``NAME.lock`` and starts the tier (:mod:`.host_serve`) with its own configuration (placement,
eviction, security, ``transport.op_timeout_s``: what a server uses), handing it the lock; the
others wait for the socket. The tier holds the lock for its life, so exactly one runs per name
and a crashed one is replaced by the next process that cannot reach it (its clients see misses
meanwhile, never a wrong byte). It exits ``idle_exit_s`` after its last client left. Its pid
is in ``NAME.lock`` (``kill $(cat NAME.lock)`` stops it cleanly), its log is ``NAME.log`` in
the same folder; its secret, unless this process configures one, is
``NAME.secret`` there (mode 0600, made by the first process).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvcr_policy.config.loading import LoadedConfig
from kvcr_policy.config.private_files import FileRefused, folder_problem, read_private
from kvcr_policy.errors import BackendUnavailableError, ConfigError, ConfigIssue, mismatch
from kvcr_policy.memory.cpus import process_cpus

from ..base import BackendContext
from ..dram.transports.base import Transport
from .backend import PeerBackend
from .credentials import ClientCredentials, client_secret
from .host_options import HostOptions
from .options import UcxOptions

__all__ = ["HostBackend", "HostOptions", "HostTier"]

log = logging.getLogger("kvcr_policy.backends.peer.host_tier")


def default_dir() -> Path:
    """``$XDG_RUNTIME_DIR/kvcr-policy`` (an absolute one), else ``/tmp/kvcr-policy-UID``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR") or ""
    if os.path.isabs(runtime):
        return Path(runtime) / "kvcr-policy"
    return Path("/tmp") / f"kvcr-policy-{os.getuid()}"


class HostTier:
    """The files of one host tier, and how to start it (see the module docstring)."""

    def __init__(self, options: HostOptions, origin: str = "default") -> None:
        self.options = options
        self.origin = origin  # where backend.options.dir came from
        self.dir = (options.dir or default_dir()).expanduser()
        base = self.dir / options.name
        self.socket = base.with_suffix(".sock")
        self.lock = base.with_suffix(".lock")
        self.secret = base.with_suffix(".secret")
        self.log = base.with_suffix(".log")

    @property
    def address(self) -> str:
        return f"unix:{self.socket}"

    def prepare(self) -> None:
        """Make the folder (0700) and refuse one that other users could write or read."""
        try:
            self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            raise self._problem(f"cannot make {self.dir}: {err.strerror or err}") from None
        problem = folder_problem(self.dir)
        if problem is None and self.dir.stat().st_mode & 0o077:
            problem = f"{self.dir} is open to other users (mode {self.dir.stat().st_mode:o})"
        if problem is not None:
            raise self._problem(f"{problem}; use a private folder (mode 0700)")

    def _problem(self, message: str) -> ConfigError:
        return ConfigError(
            [ConfigIssue("backend.options.dir", self.origin, message)],
            title="cannot use the host tier's folder",
        )

    def credentials(self, loaded: LoadedConfig) -> ClientCredentials:
        """This process's secret if it configures one, else the tier's own (made if none)."""
        secret, source = client_secret(loaded)
        if secret is not None:
            return ClientCredentials(secret, source, loaded.config.security.insecure)
        if not self.secret.exists():
            _write_secret(self.secret)
        try:
            text = read_private(self.secret).decode("utf-8").strip()
        except (FileRefused, UnicodeDecodeError) as err:
            raise self._problem(f"the tier's secret: {err}") from None
        return ClientCredentials(text.encode(), f"file {self.secret}", False)

    def start(self, loaded: LoadedConfig, credentials: ClientCredentials) -> None:
        """Start the tier unless another process serves it or is starting it; return once its
        socket accepts (BackendUnavailableError after ``start_timeout_s``). A tier that dies
        before it listens (killed while it starts) frees its lock: the next try starts one."""
        deadline = time.monotonic() + self.options.start_timeout_s
        while True:
            child = None
            if self.options.start:
                lock = os.open(self.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # it runs, or another process is starting it
                    os.close(lock)
                else:
                    try:
                        child = self._spawn(loaded, credentials, lock)
                    finally:
                        os.close(lock)  # the tier holds it now (or nobody: it failed to start)
            if self._wait(deadline, child):
                return

    def _spawn(self, loaded: LoadedConfig, credentials: ClientCredentials, lock: int) -> Any:
        overrides, secret = server_overrides(loaded, credentials)
        spec = {
            "socket": str(self.socket),
            "idle_exit_s": self.options.idle_exit_s,
            "overrides": overrides,
            "secret": secret,
            "parent": os.getpid(),
            "lock_fd": lock,
            # Every CPU of this process, not only the one this thread may be pinned to: the tier
            # serves every rank (see kvcr_policy.memory.cpus).
            "cpus": sorted(process_cpus()) or None,
        }
        log_fd = os.open(self.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        with os.fdopen(log_fd, "ab") as log_file:
            child = subprocess.Popen(
                [sys.executable, "-m", "kvcr_policy.backends.peer.host_serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                pass_fds=(lock,),
                start_new_session=True,  # outlives the rank that started it
            )
        assert child.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            child.stdin.write(json.dumps(spec).encode())
            child.stdin.close()
        log.info("started the host tier %s (pid %d, log %s)", self.address, child.pid, self.log)
        return child

    def _why(self) -> str:
        error = _last_error(self.log)
        return f": {error}" if error else ""

    def _wait(self, deadline: float, child: Any) -> bool:
        """True once the socket accepts; False when nobody holds the lock any more (the tier
        or its starter died before it listened: start one again, when this process may)."""
        pause = 0.02
        while True:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                try:
                    probe.connect(str(self.socket))
                    return True
                except OSError:
                    pass
            if child is not None and child.poll() not in (None, 0):  # 0: it went on its own
                message = (
                    f"the host tier {self.address} exited at start (status {child.returncode})"
                    f"{self._why()}; its log: {self.log}"
                )
                raise BackendUnavailableError(message)
            if time.monotonic() > deadline:
                message = (
                    f"the host tier {self.address} did not start within "
                    f"backend.options.start_timeout_s = {self.options.start_timeout_s} s "
                    f"(its log: {self.log})"
                )
                raise BackendUnavailableError(message)
            if self.options.start and not lock_held(self.lock):
                return False
            time.sleep(pause)
            pause = min(2 * pause, 0.2)


def lock_held(path: Path) -> bool:
    """Whether a process holds ``path``'s ``flock`` (a host tier runs or is starting)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # drops the shared lock taken, if any
    return False


def _last_error(log: Path) -> str:
    """The last ``cannot start`` line of the tier's log (what stopped it), or ""."""
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 16384))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    marker = "host tier: cannot start: "
    start = tail.rfind(marker)
    return "" if start < 0 else tail[start + len(marker) :].strip()


def server_overrides(
    loaded: LoadedConfig, credentials: ClientCredentials
) -> tuple[dict[str, Any], str | None]:
    """The values this process's configuration sets, for the tier it starts, and the secret its
    clients prove when it is not in a file (both sent on a pipe, never a command line)."""
    values = {path: value for path, (value, _) in loaded.changed().items()}
    for path in ("security.secret", "security.secret_file", "backend.name"):
        values.pop(path, None)
    values = {p: v for p, v in values.items() if not p.startswith("backend.options")}
    if credentials.secret is None:
        return values, None
    if credentials.source.startswith("file "):
        values["security.secret_file"] = credentials.source[len("file ") :]
        return values, None
    return values, credentials.secret.decode()


def _write_secret(path: Path) -> None:
    """A new secret in ``path`` (0600), unless a racing process wrote one first."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(secrets.token_urlsafe(32) + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


class HostBackend(PeerBackend):
    """The built-in ``host`` backend; see the module docstring. Pages are copied by the
    configured copy transport (``cpu``), between the pools and the tier's shared memory."""

    name = "host"

    def __init__(self, context: BackendContext, options: HostOptions) -> None:
        transport = context.transport
        if not isinstance(transport, Transport) or "cpu" not in transport.devices:
            name = getattr(transport, "name", type(transport).__name__)
            message = (
                f"backend 'host' copies pages with a host copy transport, but transport.name is "
                f"{name!r}; set transport.name = 'cpu'"
            )
            raise mismatch("transport.name", context.loaded.origin("transport.name"), message)
        self.tier = HostTier(options, context.loaded.origin("backend.options.dir"))
        self.tier.prepare()
        self.config = context.config
        self.options = UcxOptions(peer=self.tier.address, shared_memory="require")
        self.credentials = self.tier.credentials(context.loaded)
        self._loaded = context.loaded
        self._transport = transport
        self._init_state(context)

    def _start(self) -> None:
        self.tier.start(self._loaded, self.credentials)

    def _make_copier(self) -> Any:
        return self._transport

    def describe(self) -> dict[str, Any]:
        data = super().describe()
        for ucx_only in ("tls", "progress_mode", "ucx_env", "links"):
            data.pop(ucx_only, None)  # a host tier moves no UCX message
        data.update(name="host", tier=self.tier.address, log=str(self.tier.log))
        return data
