"""HostOptions: the ``[backend.options]`` of the ``host`` backend (:mod:`.host_tier`).

Importable without the backend itself, so the registry validates them at load time cheaply.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvcr_policy.config.fields import number_field
from kvcr_policy.config.schema import TENANT_NAME

__all__ = ["HostOptions"]

#: The shortest idle exit but 0 (off): the tier looks for clients twice a second.
MIN_IDLE_EXIT_S = 0.1


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
    idle_exit_s: float = number_field(
        300.0,
        0,
        86400,
        "A tier this process starts exits this long after its last client left "
        "(0: never, else 0.1..86400 s).",
    )
    start_timeout_s: float = number_field(
        60.0, 1, 3600, "Longest wait for the tier's socket, started here or by another process."
    )

    @field_validator("idle_exit_s")
    @classmethod
    def _off_or_sane(cls, value: float) -> float:
        if 0 < value < MIN_IDLE_EXIT_S:
            raise ValueError(f"expected 0 (never) or {MIN_IDLE_EXIT_S}..86400 s, got {value}")
        return value
