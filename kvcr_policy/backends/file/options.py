"""FileOptions: the ``[backend.options]`` of the ``file`` backend.

Importable without the backend itself, so the registry validates them at load time cheaply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvcr_policy.config.fields import number_field, size_field
from kvcr_policy.config.schema import MAX_TIER_BYTES, TENANT_NAME
from kvcr_policy.values import Size

__all__ = ["FileOptions"]


class FileOptions(BaseModel):
    """``[backend.options]`` of the ``file`` backend."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: Path | None = Field(
        None,
        description="Folder of the tier's slot files (a local file system; NVMe for speed). "
        "Required. Each pool gets <path>/<tenant>/<pool>-<layout digest>/.",
    )
    tenant: str = Field(
        "default",
        pattern=TENANT_NAME.pattern,
        description="Whose pages these are: a tenant's pools live in their own folder and "
        "together hold at most its tenant_quota_bytes.",
    )
    capacity_bytes: Size | None = size_field(
        None,
        MAX_TIER_BYTES,
        "Most page bytes per pool (e.g. '2TiB'); unset: placement.capacity_bytes.",
    )
    tenant_quota_bytes: dict[str, Size] = Field(
        default_factory=dict,
        description="Most page bytes each named tenant's pools hold together under path "
        "(e.g. {default = '500GiB'}); a tenant not named has no quota.",
    )
    min_free_bytes: Size = size_field(
        1 << 30,
        1 << 50,
        "Free-space floor: a pool's slot file is sized so that at least this much of the file "
        "system stays free (checked when the pool opens).",
        from_low=True,
    )
    direct: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Direct I/O (O_DIRECT). 'auto': writes go through the page cache, reads "
        "take the pages it still holds from it and read the others direct where the file "
        "system does direct I/O (tmpfs does not); 'on': every read and write direct (the "
        "tier's pages never take page cache; a file system without O_DIRECT is refused); "
        "'off': the page cache for everything.",
    )
    sync: Literal["batch", "none"] = Field(
        "batch",
        description="'batch': a set's pages, then their index records, are fdatasync'ed "
        "before the set reports them stored (survives power loss); 'none': written in the "
        "same order without fdatasync (survives the process being killed).",
    )
    check: Literal["records", "pages"] = Field(
        "records",
        description="Self-check when a pool opens: every index record ('records'), or also "
        "every page's checksum ('pages': reads the whole tier). Reads check each page anyway.",
    )
    io_threads: int = number_field(
        8, 1, 256, "Threads issuing preadv/pwritev (requests in flight)."
    )
    buffer_bytes: Size = size_field(
        16 << 20,
        1 << 30,
        "Page-aligned staging buffer per I/O thread: the most staged bytes of one request "
        "(at least one slot's).",
        low=4096,
        from_low=True,
    )
    preallocate: bool = Field(
        True, description="Allocate each slot file when its pool opens (posix_fallocate)."
    )
    high_watermark: float | None = number_field(
        None,
        0.01,
        1,
        "Evict (eviction strategy's order) once a set leaves more than this fraction of the "
        "slots used; unset: evict only when a set finds no free slot.",
    )
    low_watermark: float | None = number_field(
        None, 0.01, 1, "Evict down to this fraction (below high_watermark)."
    )

    @model_validator(mode="after")
    def _watermarks(self) -> FileOptions:
        high, low = self.high_watermark, self.low_watermark
        if (high is None) != (low is None) or (
            high is not None and low is not None and low >= high
        ):
            message = (
                f"high_watermark ({high}) and low_watermark ({low}): set both, with low below "
                "high (e.g. 0.95 and 0.9), or neither"
            )
            raise ValueError(message)
        return self
