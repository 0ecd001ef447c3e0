"""UcxOptions: the ``[transport.options]`` of the ``ucx`` transport and of ``kvcr-policy serve``.

Importable without ucxx, so that configs naming ``ucx`` validate (and ``show`` works) on a
machine where the optional dependency is missing; only opening a connection needs ucxx.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvcr_policy.config.fields import number_field, size_field
from kvcr_policy.config.hosts import host_port
from kvcr_policy.values import Size, shorten

__all__ = ["Capability", "SharedMemory", "Tls", "UcxOptions", "parse_address", "unix_address"]

#: Shortest heartbeat (0 is off): clients may not ask for faster ones, servers raise them to it.
MIN_HEARTBEAT_S = 0.05

Tls = Literal["auto", "sm", "tcp"]
SharedMemory = Literal["auto", "off", "require"]
#: ``unix:PATH`` names a Unix socket in the file system; ``unix:@NAME`` one in the abstract
#: namespace (unix(7)). Longest usable path: sun_path holds 108 bytes with its NUL.
UNIX_PREFIX = "unix:"
_UNIX_PATH_MAX = 107
Capability = Literal["coalesce", "split"]
ProgressMode = Literal["blocking", "polling", "thread"]
#: How long a peer may answer nothing before it is dead, unless configured (see dead_after_s).
DEAD_AFTER_S = 30.0


def unix_address(text: str, *, where: str = "address") -> str | None:
    """The socket address of ``unix:PATH`` (a path) or ``unix:@NAME`` (``"\\0NAME"``, the
    abstract namespace); None for any other text; ValueError for a bad one."""
    text = text.strip()
    if not text.startswith(UNIX_PREFIX):
        return None
    rest = text[len(UNIX_PREFIX) :]
    address = "\0" + rest[1:] if rest.startswith("@") else rest
    if not rest or rest == "@" or "\0" in rest or len(address.encode()) > _UNIX_PATH_MAX:
        message = (
            f"{where}: expected unix:PATH or unix:@NAME (at most {_UNIX_PATH_MAX} bytes, no NUL), "
            f"got {shorten(text)}"
        )
        raise ValueError(message)
    return address


def parse_address(text: str, *, where: str = "address") -> tuple[str, int]:
    """``"host:port"`` (``"[v6]:port"`` for IPv6) -> ``(host, port)``; ValueError says why."""
    return host_port(text, where=where)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names the loopback interface (``localhost`` counts)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class UcxOptions(BaseModel):
    """Options of the peer tier over UCX (client side and ``serve`` side alike).

    UCX environment knobs (``rndv_thresh``, ``tcp_seg_size``, ``net_devices``,
    ``rndv_frag_mem_type``, ``env``) are applied only where the user has not already set the
    variable; the values in force are reported by the transport's ``describe()``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    peer: str | None = Field(
        None,
        description="HOST:PORT of the `kvcr-policy serve` peer that holds the tier, or "
        "unix:PATH (unix:@NAME) of one on this host.",
    )
    listen: str = Field(
        "127.0.0.1:0",
        description="Where `kvcr-policy serve` listens when --listen is not given (port 0: any); "
        "unix:PATH: a Unix socket only, same-host clients only, no UCX.",
    )
    tls: Tls = Field(
        "auto",
        description="auto: shared memory with same-host peers, tcp (with error handling) else; "
        "sm or tcp force one.",
    )
    progress_mode: ProgressMode = Field(
        "blocking",
        description="UCX progress: blocking (epoll), polling (spin) or thread; "
        "env UCXPY_PROGRESS_MODE wins when set.",
    )
    rndv_thresh: Size | None = size_field(
        None,
        1 << 40,
        "UCX_RNDV_THRESH (at most 1TiB; ucxx sets 8192 when unset).",
        low=0,
        from_low=True,
    )
    tcp_seg_size: Size | None = size_field(
        512 << 10,
        1 << 30,
        "UCX_TCP_TX_SEG_SIZE and UCX_TCP_RX_SEG_SIZE (1KiB..1GiB; >= 512k: 5x on loopback).",
        low=1 << 10,
        from_low=True,
    )
    net_devices: str | None = Field(
        None, description="UCX_NET_DEVICES, e.g. 'lo' to keep tcp on loopback."
    )
    rndv_frag_mem_type: Literal["auto", "host", "cuda"] = Field(
        "auto",
        description="UCX_RNDV_FRAG_MEM_TYPE; auto: host unless a CUDA device is present "
        "(ucxx would set cuda).",
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Further UCX_* / UCXPY_* variables, applied if unset."
    )
    connect_timeout_s: float = number_field(
        5.0, 0.01, 3600, "Longest a connect and handshake may take (0.01..3600 s)."
    )
    heartbeat_s: float = number_field(
        2.0,
        0,
        600,
        "Ping interval while a connection waits for its peer or idles (0, or "
        "0.05..600 s). 0 disables (then only operation timeouts detect a dead peer, and the "
        "server closes a silent session after security.idle_timeout_s).",
    )
    capabilities: tuple[Capability, ...] = Field(
        ("coalesce", "split"),
        description="What `serve` declares in the handshake (drop some to test fallback).",
    )
    check_addresses: bool = Field(
        True,
        description="`serve` validates each client's UCX worker address in a helper process "
        "first (a malformed one aborts the process that unpacks it).",
    )
    max_tiers: int = number_field(
        16,
        1,
        1024,
        "Most tiers (pools of distinct layouts) one tenant may hold on `serve` (1..1024).",
    )
    cma: bool = Field(
        False,
        description="Let same-host transfers use cross-memory attach (about 20% faster for "
        "large messages here), at a price: shared-memory endpoints have no error handling, so "
        "UCX aborts this process when the peer dies mid-transfer. Off: UCX_TLS=self,posix,tcp "
        "unless UCX_TLS is set (set it for RDMA fabrics).",
    )

    dead_after_s: float = number_field(
        DEAD_AFTER_S,
        0.1,
        3600,
        "A peer that answers nothing at all for this long is dead (0.1..3600 s; "
        "default 30 s, or two heartbeat_s when that is longer): a late answer counts as life, "
        "and time this process itself was stalled never counts. `serve` closes a session whose "
        "pinging client sent nothing for this long (or security.idle_timeout_s if shorter).",
    )

    shared_memory: SharedMemory = Field(
        "auto",
        description="Same-host pages through the tier's shared memory: auto (a client uses the "
        "Unix socket a same-host server offers, unless tls is 'tcp'; memory speed, no UCX "
        "transfer), off (UCX always), require (fail unless pages move through shared memory). "
        "On `serve`: off opens no Unix socket beside a TCP listener.",
    )

    @model_validator(mode="before")
    @classmethod
    def _dead_after_default(cls, data: Any) -> Any:
        """Unset, ``dead_after_s`` is at least two heartbeats, so a long heartbeat_s alone
        never makes a live peer dead between two pings."""
        if isinstance(data, dict) and data.get("dead_after_s") is None:
            try:
                beat = float(data.get("heartbeat_s", 0))
            except (TypeError, ValueError):
                return data  # heartbeat_s's own validation says what is wrong with it
            if 0 < beat <= 600:
                data = {**data, "dead_after_s": max(DEAD_AFTER_S, 2 * beat)}
        return data

    @model_validator(mode="after")
    def _dead_after_heartbeats(self) -> UcxOptions:
        if self.heartbeat_s > 0 and self.dead_after_s < 2 * self.heartbeat_s:
            message = (
                f"dead_after_s = {self.dead_after_s} s is shorter than two heartbeats "
                f"(heartbeat_s = {self.heartbeat_s} s): a live peer would be declared dead "
                "between two pings; raise dead_after_s or lower heartbeat_s"
            )
            raise ValueError(message)
        return self

    @field_validator("heartbeat_s")
    @classmethod
    def _heartbeat_off_or_sane(cls, value: float) -> float:
        # A ping every 1e-300 s is a busy loop, not a heartbeat.
        if 0 < value < MIN_HEARTBEAT_S:
            message = f"expected 0 (off) or {MIN_HEARTBEAT_S}..600 s, got {value}"
            raise ValueError(message)
        return value

    @field_validator("peer", "listen")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None and unix_address(value) is None:
            parse_address(value)
        return value

    @field_validator("env")
    @classmethod
    def _ucx_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [name for name in value if not name.startswith(("UCX_", "UCXPY_"))]
        if bad:
            message = f"env: only UCX_* and UCXPY_* variables may be set here, got {', '.join(bad)}"
            raise ValueError(message)
        return value
