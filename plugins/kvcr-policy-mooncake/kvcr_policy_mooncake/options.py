"""MooncakeOptions: the ``[backend.options]`` of the ``mooncake`` backend.

Importable without Mooncake itself, so a profile naming ``mooncake`` validates (and
``kvcr-policy show`` works) where the transfer engine is not installed; only building the
backend needs it. Each option is also settable from the environment as
``KVCR_POLICY_BACKEND__OPTIONS__<NAME>`` (e.g. ``KVCR_POLICY_BACKEND__OPTIONS__MASTER``).
"""

from __future__ import annotations

from typing import Literal, cast

from pydantic import BaseModel, ByteSize, ConfigDict, Field, field_validator

from kvcr_policy.plugin_api import (
    Size,
    follow_coalescing,
    host_port,
    number_field,
    size_field,
    staging_below_field,
    staging_bytes_field,
)

__all__ = ["MIN_SEGMENT_BYTES", "MooncakeOptions", "resolved_call_priority", "split_address"]

#: Mooncake refuses a smaller segment ("Total size must be at least 16777216",
#: mooncake-store client_buffer_allocation.cpp); 0 contributes no segment at all.
MIN_SEGMENT_BYTES = 16 << 20


def split_address(text: str, *, where: str = "master") -> tuple[str, int]:
    """``"host:port"`` (``"[v6]:port"`` for IPv6) -> ``(host, port)``; ValueError says why."""
    return host_port(text, where=where, example="10.0.0.5:50051", low_port=1)


class MooncakeOptions(BaseModel):
    """Where the Mooncake master is and what this client contributes to the store.

    Placement across the cluster is the master's: ``replicas`` and ``preferred_segment`` are
    handed to every put (Mooncake's ``ReplicateConfig``); eviction and leases are configured
    on ``mooncake_master``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    master: str = Field(
        ...,
        description="HOST:PORT of mooncake_master's RPC service (its --rpc_address and "
        "--rpc_port; Mooncake's default port is 50051).",
    )
    metadata: str = Field(
        "P2PHANDSHAKE",
        description="Transfer-engine metadata: P2PHANDSHAKE (no metadata server), or the URL "
        "of one (http://HOST:PORT/metadata, etcd://HOST:PORT).",
    )
    protocol: Literal["tcp", "rdma"] = Field(
        "tcp", description="How pages move between hosts: tcp, or rdma (needs device)."
    )
    device: str = Field(
        "", description="RDMA device names, comma-separated (e.g. mlx5_0,mlx5_1); '' for tcp."
    )
    local_hostname: str = Field(
        "auto",
        description="The address other clients reach this one at; auto: this host's address "
        "on the route to the master (127.0.0.1 when the master is on loopback).",
    )
    segment_bytes: Size = size_field(
        4 << 30,
        1 << 48,
        "Memory this client contributes to the store (0: none, a pure reader or "
        "writer; else at least 16MiB, at most 256TiB). Pages land in any client's segment.",
        low=0,
        from_low=True,
    )
    buffer_bytes: Size = size_field(
        16 << 20,
        1 << 40,
        "The client's local transfer buffer (pages move zero-copy from the "
        "registered pool; Mooncake still needs one; at most 1TiB).",
    )
    replicas: int = number_field(1, 1, 16, "Copies of each page across segments.")
    preferred_segment: str | None = Field(
        None,
        description="Segment puts should land in first (a client's HOST:PORT name; 'local': "
        "this client's own segment); unset: the master's allocation strategy decides.",
    )
    tenant: str = Field(
        "default",
        min_length=1,
        description="Mooncake tenant of this client's pages. Object keys of any tenant but "
        "'default' carry it, so clients of different tenants never read, overwrite or clear "
        "each other's pages on any master; a master started with --enable_multi_tenants and a "
        "tenant quota policy naming the tenant also keeps tenants apart itself and enforces "
        "each one's quota. Mooncake authenticates no client: this keeps apart deployments "
        "that share a master, not a hostile client.",
    )
    connect_timeout_s: float = number_field(
        10.0,
        0.01,
        600,
        "Start-up fails after this long without an answering master (0.01..600 s; "
        "else "
        "Mooncake's own setup() blocks about 90 s).",
    )
    threads: int | None = number_field(
        None,
        1,
        64,
        "Store calls in flight at once; unset: batching.window_batches, or 1 "
        "when the window is unbounded (one synchronous call at a time, as upstream).",
    )
    call_buffers: int | None = number_field(
        None,
        1,
        1 << 20,
        "Most buffers (page fragments) one store call moves, at most 1048576; a "
        "bigger batch is cut into calls of this many. Unset, and never more: the tcp "
        "transport's per-peer queue (MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER, 1024 unless set).",
    )
    recheck_s: float = number_field(
        0.5,
        0.01,
        60,
        "How often the master is checked (0.01..60 s): while it is down every call "
        "answers misses at once, and service resumes within this long of it coming back.",
    )

    staging: Literal["never", "auto", "always"] = Field(
        "never",
        description="Pages of many fragments (layer_first: one per layer and side) through a "
        "registered host staging area: gathered into it and put as one buffer per page "
        "(restores: read as one buffer and scattered into the pool), instead of the "
        "multi-buffer calls that send one transfer per fragment. 'never' (upstream): the "
        "multi-buffer calls; 'auto': pages of more than one fragment, each smaller than "
        "staging_below_bytes; 'always': every page of more than one fragment.",
    )
    staging_bytes: Size = staging_bytes_field(256 << 20)
    staging_below_bytes: Size = staging_below_field(1 << 20)

    call_priority: Literal["with_coalescing", "normal", "idle", "auto"] = Field(
        "with_coalescing",
        description="Scheduling of the threads that make the store calls, each of which "
        "polls a core until its transfers complete (Mooncake's PyPI builds). 'normal' "
        "(upstream): the batch's worker thread; 'idle': threads of the SCHED_IDLE policy, "
        "which poll only on a core nothing else wants, so the threads moving the bytes get "
        "the cores (but notice a finished call late on a host whose cores are all busy); "
        "'auto': idle while the host's running tasks leave one of this process's cores free, "
        "else normal, decided before each call; 'with_coalescing' (the default) is 'auto' "
        "when coalescing.strategy is not 'none', else 'normal'.",
    )

    @field_validator("master")
    @classmethod
    def _master_is_host_port(cls, value: str) -> str:
        split_address(value)
        return value.strip()

    @field_validator("segment_bytes")
    @classmethod
    def _segment_is_usable(cls, value: ByteSize) -> ByteSize:
        if 0 < value < MIN_SEGMENT_BYTES:
            message = (
                f"expected 0 (contribute no segment) or at least 16MiB (Mooncake's smallest "
                f"segment), got {int(value)} bytes"
            )
            raise ValueError(message)
        return value


def resolved_call_priority(
    options: MooncakeOptions, coalescing: str
) -> Literal["normal", "idle", "auto"]:
    """The call priority (``normal``, ``idle`` or ``auto``) a backend with ``options`` runs
    under ``coalescing.strategy = coalescing``: ``with_coalescing`` is ``normal`` (upstream)
    under ``none``, the default profile's, else ``auto`` (the core's rule,
    :func:`kvcr_policy.plugin_api.follow_coalescing`)."""
    mode = follow_coalescing(options.call_priority, coalescing, off="normal")
    return cast('Literal["normal", "idle", "auto"]', mode)
