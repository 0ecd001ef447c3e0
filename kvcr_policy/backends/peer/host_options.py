"""HostOptions: the ``[backend.options]`` of the ``host`` backend (:mod:`.host_tier`).

Importable without the backend itself, so the registry validates them at load time cheaply.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvcr_policy.config.schema import TENANT_NAME

__all__ = ["MIN_IDLE_EXIT_S", "HostOptions"]

#: The least idle time a host tier waits before it exits (0: it never exits by itself).
MIN_IDLE_EXIT_S = 1.0


class HostOptions(BaseModel):
    """``[backend.options]`` of the ``host`` backend."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        "default",
        pattern=TENANT_NAME.pattern,
        description="The host tier's name: processes naming the same one share it (letters, "
        "digits, '.', '_', '-'; at most 64).",
    )
    dir: Path | None = Field(
        None,
        description="Folder of its socket, lock, secret and log (default "
        "$XDG_RUNTIME_DIR/kvcr-policy, else /tmp/kvcr-policy-UID; made mode 0700).",
    )
    start: bool = Field(
        True, description="Start the tier when none runs (false: wait for one started else)."
    )
    idle_exit_s: float = Field(
        300.0,
        ge=0,
        le=86400,
        allow_inf_nan=False,
        description="A tier this process starts exits this long after its last client left "
        "(0: never; else at least 1 s).",
    )
    start_timeout_s: float = Field(
        60.0,
        ge=1,
        le=3600,
        allow_inf_nan=False,
        description="Longest wait for the tier's socket, started here or by another process.",
    )

    @field_validator("idle_exit_s")
    @classmethod
    def _never_or_sane(cls, value: float) -> float:
        # An idle check every 1e-300 s would end a tier before its first client connects.
        if 0 < value < MIN_IDLE_EXIT_S:
            raise ValueError(f"expected 0 (never) or {MIN_IDLE_EXIT_S:g}..86400 s, got {value}")
        return value
