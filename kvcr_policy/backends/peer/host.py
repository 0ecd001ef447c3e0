"""Which host (and which shared-memory world) this process lives in.

Two processes may use UCX shared memory (sysv/posix segments, cross-memory attach) only when
they share a kernel boot, an IPC namespace and a PID namespace; :func:`host_id` folds exactly
those into one string, so "same host id" means "shared memory can work".
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket

__all__ = ["host_id"]


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _namespace(kind: str) -> str:
    try:
        return os.readlink(f"/proc/self/ns/{kind}")
    except OSError:
        return ""


@functools.cache
def host_id() -> str:
    """A short stable digest of boot id, hostname, and the IPC and PID namespaces."""
    parts = [
        _read("/proc/sys/kernel/random/boot_id"),
        socket.gethostname(),
        _namespace("ipc"),
        _namespace("pid"),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
