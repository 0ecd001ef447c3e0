"""Batches sized in bytes, not pages, optionally ramping up from a small first batch.

The built-in ``fixed`` strategy counts pages: its upstream 128 pages are 2 MiB per batch on a
pool of 16 KiB pages (so per-batch overhead dominates) and 2 GiB on a pool of 16 MiB pages (so
the first usable prefix arrives late and a window of a few batches pins gigabytes). ``adaptive``
aims every batch at ``target_batch_bytes`` instead: small-page pools get more pages per batch,
huge-page pools fewer.

The batching protocol hands a strategy only a page count (``read_batches(n_pages)``), so the
pool's page size comes from the options (``page_bytes``); use one ``[batching.options]`` per
pool geometry. With ``first_batch_bytes`` set, the first batch is that small and each next one
doubles up to the target, so the leading prefix (all HiCache uses) completes early while later
batches stay large.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, model_validator

from kvcr_policy.plugin_api import (
    BatchingSection,
    Size,
    Window,
    hookimpl,
    number_field,
    size_field,
    tunable,
)

if TYPE_CHECKING:
    from kvcr_policy.plugin_api import RegisterStrategy

__all__ = ["AdaptiveBatching", "AdaptiveOptions", "kvcr_register_strategies"]


class AdaptiveOptions(BaseModel):
    """``[batching.options]`` of the ``adaptive`` strategy; unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    page_bytes: Size = size_field(
        ...,
        1 << 40,
        "Bytes of one page of the pool (e.g. '16MiB' for qwen3-32b, P=64; at most 1TiB).",
    )
    target_batch_bytes: Size = size_field(
        256 << 20,
        1 << 48,
        "Bytes a read batch aims at (e.g. '256MiB'; at most 256TiB).",
        tuned=tunable(choices=("4MiB", "16MiB", "64MiB", "256MiB", "1GiB", "4GiB")),
    )
    first_batch_bytes: Size | None = size_field(
        None,
        1 << 48,
        "Bytes of the first batch; each next one doubles up to the target. Unset: "
        "every batch aims at the target.",
    )
    min_batch_pages: int = number_field(
        1, 0, 65536, "Fewest pages in a full-size batch (1..65536).", above=True
    )
    max_batch_pages: int = number_field(
        4096, 0, 65536, "Most pages in any batch (1..65536).", above=True
    )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> AdaptiveOptions:
        if self.min_batch_pages > self.max_batch_pages:
            message = (
                f"batching.options.min_batch_pages ({self.min_batch_pages}) must be at most "
                f"batching.options.max_batch_pages ({self.max_batch_pages})"
            )
            raise ValueError(message)
        if self.first_batch_bytes is not None and self.first_batch_bytes > self.target_batch_bytes:
            message = (
                f"batching.options.first_batch_bytes ({self.first_batch_bytes}) must be at most "
                f"batching.options.target_batch_bytes ({self.target_batch_bytes}); it starts "
                "the ramp up to the target"
            )
            raise ValueError(message)
        return self


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


class AdaptiveBatching:
    """Read batches of about ``target_batch_bytes``; query batches of ``query_batch_keys``.

    ``read_batch_pages`` is not used. The delivery window comes from the section as in
    ``fixed``, and a batch never outgrows it: a batch larger than ``window_pages`` or
    ``window_bytes`` could only ever run alone.
    """

    def __init__(self, section: BatchingSection, options: AdaptiveOptions) -> None:
        page = int(options.page_bytes)
        window_bytes = int(section.window_bytes) if section.window_bytes is not None else None
        self.window = Window(section.window_batches, section.window_pages, window_bytes)
        pages = _clamp(
            int(options.target_batch_bytes) // page,
            options.min_batch_pages,
            options.max_batch_pages,
        )
        if section.window_pages is not None:
            pages = min(pages, section.window_pages)
        if window_bytes is not None:
            pages = min(pages, max(1, window_bytes // page))
        self.batch_pages = pages
        first = options.first_batch_bytes
        self.first_batch_pages = pages if first is None else _clamp(int(first) // page, 1, pages)
        self.query_batch_keys = section.query_batch_keys

    def read_batches(self, n_pages: int) -> list[tuple[int, int]]:
        batches: list[tuple[int, int]] = []
        start, size = 0, self.first_batch_pages
        while start < n_pages:  # one step per batch, never per page
            stop = min(start + size, n_pages)
            batches.append((start, stop))
            start, size = stop, min(size * 2, self.batch_pages)
        return batches

    def query_batches(self, n_keys: int) -> list[tuple[int, int]]:
        size = self.query_batch_keys
        return [(start, min(start + size, n_keys)) for start in range(0, n_keys, size)]


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register(
        "batching",
        "adaptive",
        AdaptiveBatching,
        options=AdaptiveOptions,
        description="Batches sized in bytes (target_batch_bytes / page_bytes), optional ramp-up.",
    )
