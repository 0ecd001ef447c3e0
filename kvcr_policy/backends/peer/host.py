"""Which host (and which shared-memory world) this process lives in.

Two processes may use UCX shared memory (sysv/posix segments, cross-memory attach) only when
they share a kernel boot, an IPC namespace and a PID namespace; :func:`host_id` folds exactly
those into one string, so "same host id" means "shared memory can work". :func:`interface_of`
names the network interface that holds an address (where a server's UCX worker may listen).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import ipaddress
import os
import socket
import struct

__all__ = ["host_id", "interface_of"]

# ioctl(2) request that reads an interface's IPv4 address: include/uapi/linux/sockios.h.
_SIOCGIFADDR = 0x8915


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


def interface_of(host: str) -> str | None:
    """The interface whose address is ``host`` (``lo`` for loopback), or None: a wildcard
    (``0.0.0.0``, ``::``), a name, or an address no interface of this host holds."""
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if address.is_unspecified:
        return None
    names = [name for _, name in socket.if_nameindex()]
    if address.is_loopback:
        return next((n for n in names if n == "lo"), None)
    if address.version == 6:
        return _inet6_interface(address.packed.hex())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in names:
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):  # an interface without an IPv4 address
                answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
                if answer[20:24] == address.packed:
                    return name
    return None


def _inet6_interface(hex_address: str) -> str | None:
    """From /proc/net/if_inet6: "address index prefix scope flags name" per line (proc(5))."""
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) == 6 and fields[0] == hex_address:
                    return fields[5]
    except OSError:
        pass
    return None
