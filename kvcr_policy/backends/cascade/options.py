"""CascadeOptions: the ``[backend.options]`` of the ``cascade`` backend."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..file.options import FileOptions

__all__ = ["CascadeOptions"]


class CascadeOptions(BaseModel):
    """``[backend.options]`` of ``cascade``: DRAM (``placement.capacity_bytes``, the copy
    transport) in front of the ``file`` tier (``file``: its own options)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    file: FileOptions = Field(
        default_factory=FileOptions,
        description="Options of the disk level, as backend.options of 'file' (path required).",
    )
    admit_hits: int = Field(
        1,
        ge=1,
        le=1 << 20,
        description="A page leaving DRAM is demoted to disk only if it was used at least this "
        "often there (its set counts as one use; 2: on its second hit); else it is dropped.",
    )
    promote: bool = Field(True, description="A hit on disk also copies the page into DRAM.")
