"""Built-in batching: fixed-size read and metadata-query batches, optional delivery windows."""

from __future__ import annotations

from ..config.schema import BatchingSection
from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterStrategy
from ..strategies import Window

__all__ = ["FixedBatching", "cut_ends", "joined", "least_pages", "ramp", "ranges"]


def ranges(total: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges of at most ``size`` covering ``range(total)`` in order."""
    return [(start, min(start + size, total)) for start in range(0, total, size)]


def ramp(total: int, first: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges covering ``range(total)`` in order: the first of ``first``
    pages, each next twice the last, up to ``size``."""
    out: list[tuple[int, int]] = []
    start, step = 0, min(first, size)
    while start < total:
        stop = min(start + step, total)
        out.append((start, stop))
        start, step = stop, min(2 * step, size)
    return out


def joined(batches: list[tuple[int, int]], least: int) -> list[tuple[int, int]]:
    """Consecutive ``[start, stop)`` ranges of ``batches`` (in order, each following the last)
    joined until each holds at least ``least`` pages; the last may hold fewer. No range is cut:
    a strategy's batch boundaries stay boundaries."""
    if least <= 1 or not batches:
        return batches
    out: list[tuple[int, int]] = []
    start = batches[0][0]
    for _, stop in batches:
        if stop - start >= least:
            out.append((start, stop))
            start = stop
    if start < batches[-1][1]:
        out.append((start, batches[-1][1]))
    return out


def cut_ends(batches: list[tuple[int, int]], pages: int | None) -> list[tuple[int, int]]:
    """``batches`` with their first ``pages`` pages and their last ``pages`` pages each a batch
    of its own, cut off the first and the last batch where those are longer; unchanged when
    ``pages`` is None. A write's first copies then start once that much is prepared, and its
    last batch, whose keys are published after its last copy, holds no more (writes that
    publish early, :class:`~kvcr_policy.backends.base.PublishesEarly`)."""
    if not pages or not batches:
        return batches
    out = list(batches)
    start, stop = out[0]
    if stop - start > pages:
        out[:1] = [(start, start + pages), (start + pages, stop)]
    start, stop = out[-1]
    if stop - start > pages:
        out[-1:] = [(start, stop - pages), (stop - pages, stop)]
    return out


def least_pages(read_batch_bytes: int | None, page_bytes: int) -> int:
    """Pages a joined batch holds at least (``batching.read_batch_bytes`` over the page size,
    rounded up); 1, no joining, when it is unset."""
    if not read_batch_bytes or page_bytes <= 0:
        return 1
    return -(-int(read_batch_bytes) // page_bytes)


class FixedBatching:
    """Batches of ``read_batch_pages`` pages and ``query_batch_keys`` keys (upstream: 128/128);
    with ``first_batch_pages``, a call's batches ramp up to that size from a small first one."""

    def __init__(self, section: BatchingSection, options: NoOptions) -> None:
        self.read_batch_pages = section.read_batch_pages
        self.first_batch_pages = section.first_batch_pages
        self.query_batch_keys = section.query_batch_keys
        window_bytes = int(section.window_bytes) if section.window_bytes is not None else None
        self.window = Window(section.window_batches, section.window_pages, window_bytes)

    def read_batches(self, n_pages: int) -> list[tuple[int, int]]:
        if self.first_batch_pages is None:
            return ranges(n_pages, self.read_batch_pages)
        return ramp(n_pages, self.first_batch_pages, self.read_batch_pages)

    def query_batches(self, n_keys: int) -> list[tuple[int, int]]:
        return ranges(n_keys, self.query_batch_keys)


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register(
        "batching",
        "fixed",
        FixedBatching,
        description="Fixed-size read and query batches; delivery windows bound what is in flight.",
    )
