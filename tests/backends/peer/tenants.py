"""Tenants for the security tests: secret files, a server that knows them, clients of each."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.backends.peer.peer_helpers import SERVER_SETS, need_ucxx


def write_secret(path: Path, text: str | None = None, mode: int = 0o600) -> Path:
    path.write_text((text or secrets.token_urlsafe(32)) + "\n", encoding="utf-8")
    path.chmod(mode)
    return path


def tenants_dir(root: Path, names: tuple[str, ...] = ("alice", "bob")) -> Path:
    """A private directory with one secret file per tenant."""
    folder = root / "tenants"
    folder.mkdir(mode=0o700)
    for name in names:
        write_secret(folder / name)
    return folder


def start_peer(folder: Path, args: tuple[str, ...] = (), **sets: Any) -> Any:
    """`kvcr-policy serve` with the tenants of ``folder`` (and short timeouts for tests), and
    the command-line ``args`` besides (``--metrics 0``)."""
    need_ucxx()
    from kvcr_policy.backends.peer.process import PeerProcess

    values: dict[str, Any] = {
        **SERVER_SETS,
        "security.tenants_dir": str(folder),
        "security.handshake_timeout_s": 2,
        # Long enough that a legitimate client starved on a loaded host is never closed as
        # silent; the tests of the idle timeout set their own.
        "security.idle_timeout_s": 30,
    }
    values.update({key.replace("__", "."): value for key, value in sets.items()})
    return PeerProcess(values, args=args)


def client_factory(address: str) -> Iterator[Callable[..., Any]]:
    """``make(secret_file=None, **overrides)``: pipelines on ``address``, closed after."""
    from kvcr_policy import build_pipeline, load_config

    opened: list[Any] = []

    def make(secret_file: Path | None = None, profile: str | None = None, **overrides: Any) -> Any:
        values: dict[str, Any] = {
            "transport.name": "ucx",
            "transport.options.peer": address,
            "transport.options.heartbeat_s": 0.5,
            **{key.replace("__", "."): value for key, value in overrides.items()},
        }
        if secret_file is not None:
            values["security.secret_file"] = str(secret_file)
        pipeline = build_pipeline(load_config(profile=profile, overrides=values))
        opened.append(pipeline)
        return pipeline

    yield make
    for pipeline in opened:
        pipeline.close()


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def listening_addresses(pid: int) -> list[str]:
    """Local addresses of the TCP sockets process ``pid`` listens on (/proc/PID/net/tcp*)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: TCP_LISTEN (include/net/tcp_states.h)
                continue
            found.append(_address(local.split(":")[0]))
    return found


def _address(hex_address: str) -> str:
    import ipaddress

    raw = bytes.fromhex(hex_address)
    # /proc/net/tcp prints each 32-bit word in host (little-endian) order.
    return str(ipaddress.ip_address(b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))))
