"""Options of the cuda transport (``[transport.options]`` when ``transport.name = "cuda"``).

A model of its own so the configuration loads, and its schema is written, on machines
without torch or CUDA.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvcr_policy.config.fields import number_field, size_field
from kvcr_policy.config.tunable import tunable
from kvcr_policy.strategies import follow_coalescing
from kvcr_policy.values import Size

__all__ = ["CudaOptions", "resolved_calls", "resolved_modes"]


class CudaOptions(BaseModel):
    """Options of ``[transport.options]`` when ``transport.name = "cuda"``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gather: Literal["with_coalescing", "auto", "always", "never"] = Field(
        "with_coalescing",
        description=(
            "Index kernels for batches of many small descriptors: 'auto' when a batch has at "
            "least gather_min_descriptors whose mean is below gather_below_bytes; 'never' "
            "issues one copy per descriptor (upstream); 'with_coalescing' is 'auto' when "
            "coalescing.strategy is not 'none', else 'never'."
        ),
        json_schema_extra=tunable(choices=("auto", "always", "never")),
    )
    copy_calls: Literal["with_coalescing", "batched", "each"] = Field(
        "with_coalescing",
        description=(
            "How copies between the tier and a GPU are issued: 'batched' issues every piece of "
            "a batch (or of a staging buffer) in one cudaMemcpyBatchAsync, half on a second "
            "stream (CUDA 12.8 or later; else one call each); 'each' one copy call per piece "
            "(upstream); 'with_coalescing' is 'batched' when coalescing.strategy is not "
            "'none', else 'each'."
        ),
        json_schema_extra=tunable(choices=("batched", "each")),
    )
    gather_below_bytes: Size = size_field(
        256 << 10,
        1 << 40,
        "auto: a batch whose mean descriptor is smaller is fragmented: staged "
        "when its host runs are long, else gathered (at most 1TiB).",
        tuned=tunable(choices=("256KiB", "1MiB", "2MiB", "8MiB", "32MiB")),
    )
    gather_min_descriptors: int = number_field(
        64,
        1,
        1 << 30,
        "auto: gather only batches with at least this many descriptors (at most 1073741824).",
        tuned=tunable(choices=(8, 32, 64, 256, 1024)),
    )
    gather_chunk_bytes: Size = size_field(
        256 << 20,
        1 << 40,
        "Most bytes one gather kernel moves (also bounds its GPU scratch memory; at most 1TiB).",
        tuned=tunable(choices=("32MiB", "64MiB", "256MiB", "1GiB")),
    )
    staging: Literal["with_coalescing", "auto", "always", "never"] = Field(
        "with_coalescing",
        description=(
            "A ring of GPU staging buffers for batches between a GPU pool and the tier: each "
            "contiguous host run (a whole tier slot) crosses PCIe as one copy and an index kernel "
            "scatters it into the pool (stores: the reverse). 'auto' when a batch has at least "
            "gather_min_descriptors whose mean is below gather_below_bytes and its host runs "
            "average staging_min_span_bytes or more; 'never' (upstream) never; "
            "'with_coalescing' is 'auto' when coalescing.strategy is not 'none', else 'never'."
        ),
        json_schema_extra=tunable(choices=("auto", "always", "never")),
    )
    staging_buffer_bytes: Size = size_field(
        32 << 20,
        1 << 34,
        "Bytes of one staging buffer (at most 16GiB); the ring takes "
        "staging_buffers of them on each GPU, once, when a tier registers with staging on.",
        tuned=tunable(choices=("8MiB", "16MiB", "32MiB", "64MiB", "128MiB")),
    )
    staging_buffers: int = number_field(
        8,
        2,
        64,
        "Buffers in the staging ring (2..64): how many copies and scatters overlap, "
        "and how much of a read is copied ahead while its first batch is planned.",
        tuned=tunable(choices=(2, 3, 4, 8)),
    )
    staging_min_span_bytes: Size = size_field(
        256 << 10,
        1 << 40,
        "auto: stage only batches whose contiguous host runs average at least this "
        "(at most 1TiB); shorter runs cross PCIe no faster than the fragments themselves "
        "(with copy_calls 'each', runs below about 4MiB cross slower than they would gathered).",
        tuned=tunable(choices=("256KiB", "1MiB", "4MiB", "16MiB")),
    )
    tier_slots: Literal["with_staging", "mirror", "whole"] = Field(
        "with_staging",
        description=(
            "How the dram tier lays out a slot: 'mirror' (upstream) mirrors the pool's planes, "
            "so a prefix stored together coalesces into a few large copies; 'whole' keeps each "
            "slot one contiguous page, so slots scattered by eviction churn still cross PCIe "
            "whole through the staging ring; 'with_staging' is 'whole' when staging is not "
            "'never', else 'mirror'."
        ),
        json_schema_extra=tunable(choices=("mirror", "whole")),
    )


def resolved_calls(options: CudaOptions, coalescing: str) -> str:
    """``batched`` or ``each``: :attr:`CudaOptions.copy_calls` under ``coalescing.strategy``."""
    if options.copy_calls != "with_coalescing":
        return options.copy_calls
    return "each" if coalescing == "none" else "batched"


def resolved_modes(options: CudaOptions, coalescing: str) -> tuple[str, str, bool]:
    """``(gather, staging, whole_slots)`` as a transport with ``options`` runs them under
    ``coalescing.strategy = coalescing``: each ``with_*`` default resolved (no torch needed,
    so ``kvcr-policy plan`` predicts the tier layout a run will use)."""
    gather = follow_coalescing(options.gather, coalescing)
    staging = follow_coalescing(options.staging, coalescing)
    slots = options.tier_slots
    if slots == "with_staging":
        slots = "mirror" if staging == "never" else "whole"
    return gather, staging, slots == "whole"
