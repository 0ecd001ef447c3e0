"""KvcrOptions: the ``[backend.options]`` of the ``kvcr`` backend.

Importable without ``kvcr`` itself, so that a profile naming the backend validates (and
``kvcr-policy show`` works) on a machine where the runner is not installed; only opening a pool
needs it. Everything else the runner takes comes from the sections every backend reads:
``placement`` (the DRAM region of KVCR's local pool, and the eviction policy),
``transport.op_timeout_s`` (KVCR's operation timeout) and ``batching`` (the size of each
``deliver`` / ``deposit`` / ``query`` call and how many are in flight).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvcr_policy.plugin_api import (
    Size,
    follow_coalescing,
    number_field,
    size_field,
    staging_below_field,
    staging_bytes_field,
)

__all__ = ["KvcrOptions", "resolved_staging", "tls_keeps_tcp"]


def tls_keeps_tcp(value: str) -> bool:
    """Whether a ``UCX_TLS`` value leaves the tcp transport available.

    NIXL's UCX backend asks for peer error handling, which only tcp gives among the transports
    of a CPU machine: without it the backend fails to start (``NIXL_ERR_BACKEND``). ``all`` and
    an exclusion list (``^cma``) that does not name tcp keep it.
    """
    text = value.strip()
    if text.startswith("^"):
        return "tcp" not in {t.strip() for t in text[1:].split(",")}
    names = {t.strip() for t in text.split(",")}
    return bool(names & {"tcp", "all"})


class KvcrOptions(BaseModel):
    """Options of the ``kvcr`` tier backend (the KVCR runner); unknown keys are errors.

    Process defaults (``ucx_net_devices``, ``ucx_tls``, ``env``) are environment variables that
    NIXL's UCX reads when a runner starts: each is set only where the variable is unset, so a
    value the user exported always wins; ``describe()`` reports each with its source.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    listen_port: int | None = number_field(
        None,
        1,
        65535,
        "Port of the NIXL metadata listener KVCR requires (one per pool, so a "
        "port given here serves a single pool); unset: a free port is chosen per pool.",
    )
    ucx_net_devices: str | None = Field(
        "lo",
        description="UCX_NET_DEVICES for the runner (unless set in the environment): 'lo' keeps "
        "UCX's tcp on loopback, where a local tier moves its bytes; none: UCX's own default "
        "(every interface).",
    )
    ucx_tls: str | None = Field(
        None,
        description="UCX_TLS for the runner (unless set in the environment); must keep tcp, "
        "which NIXL's UCX backend needs for peer error handling. Unset: UCX's default (all).",
    )
    progress_thread: bool = Field(
        False,
        description="Start NIXL's own progress thread. Off by default: KVCR already polls every "
        "transfer from its progress thread, and NIXL's thread spins a whole core while idle.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Further UCX_* variables for the runner, each applied only if unset.",
    )
    poll_interval_s: float = number_field(
        0.0005,
        0.00001,
        0.1,
        "How often completions are collected while KVCR operations are in flight "
        "(KVCR's own progress loop looks at its transfers about once a millisecond).",
    )
    g3_paths: tuple[Path, ...] = Field(
        (),
        description="Files of KVCR's G3 file tier (one set per pool: the pool name is appended); "
        "empty: no G3. Pages must be one fragment (MLA page-first layouts) in kvcr 0.1.1.",
    )
    g3_capacity_bytes_per_file: Size | None = size_field(
        None,
        1 << 48,
        "Bytes of each G3 file: whole pages, required with g3_paths (at most 256TiB).",
    )
    g3_backend: str = Field(
        "POSIX", min_length=1, description="NIXL backend of the G3 file tier (POSIX on CPU)."
    )

    staging: Literal["with_coalescing", "never", "auto", "always"] = Field(
        "with_coalescing",
        description="Pages of many fragments (layer_first: one per layer and side) through a "
        "registered staging area: each page is gathered into one slot and stored as one KVCR "
        "element (restores: one element delivered into a slot and scattered into the pool), "
        "instead of one element per fragment. 'never' (upstream): one element per fragment; "
        "'auto': pages of more than one fragment, each smaller than staging_below_bytes; "
        "'always': every page of more than one fragment; 'with_coalescing' (the default) is "
        "'auto' when coalescing.strategy is not 'none', else 'never'. The form is fixed per "
        "pool when it is attached (staged blocks are keyed apart: the other form never finds "
        "them).",
    )
    staging_bytes: Size = staging_bytes_field(64 << 20, " with KVCR")
    staging_below_bytes: Size = staging_below_field(
        64 << 10,
        "the default stages the 16 KiB and 32 KiB fragments of small layer_first pages, where "
        "one element per page pays, not the 64 KiB and larger ones, where it costs.",
    )

    @field_validator("ucx_tls")
    @classmethod
    def _keeps_tcp(cls, value: str | None) -> str | None:
        if value is not None and not tls_keeps_tcp(value):
            message = (
                f"expected a UCX_TLS value that keeps tcp (NIXL's UCX backend needs it for peer "
                f"error handling), got {value!r}; add tcp, e.g. {value.rstrip(',') + ',tcp'!r}"
            )
            raise ValueError(message)
        return value

    @field_validator("env")
    @classmethod
    def _ucx_names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = sorted(name for name in value if not name.startswith("UCX_"))
        if bad:
            message = f"only UCX_* variables may be set here, got {', '.join(bad)}"
            raise ValueError(message)
        for name in ("UCX_NET_DEVICES", "UCX_TLS"):
            if name in value:
                option = "ucx_net_devices" if name == "UCX_NET_DEVICES" else "ucx_tls"
                message = f"set {name} with backend.options.{option}, not in env"
                raise ValueError(message)
        return value

    @model_validator(mode="after")
    def _g3_sized(self) -> KvcrOptions:
        if self.g3_paths and self.g3_capacity_bytes_per_file is None:
            message = "g3_paths needs g3_capacity_bytes_per_file (bytes of each G3 file)"
            raise ValueError(message)
        if self.g3_capacity_bytes_per_file is not None and not self.g3_paths:
            message = "g3_capacity_bytes_per_file is set but g3_paths is empty; name the files"
            raise ValueError(message)
        return self


def resolved_staging(options: KvcrOptions, coalescing: str) -> str:
    """The staging mode (``never``, ``auto`` or ``always``) a backend with ``options`` runs
    under ``coalescing.strategy = coalescing``: ``with_coalescing`` is ``never`` (upstream: one
    element per fragment) under ``none``, the default profile's, else ``auto`` (the core's
    rule, :func:`kvcr_policy.plugin_api.follow_coalescing`)."""
    return follow_coalescing(options.staging, coalescing)
