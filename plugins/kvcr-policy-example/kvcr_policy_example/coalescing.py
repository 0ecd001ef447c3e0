"""``pieces``: a coalescing strategy that merges contiguous runs, then cuts each into N pieces.

It shows that a third-party coalescing strategy reaches every backend that accepts shaped
descriptors: the mover hands each batch's plain descriptors to :meth:`Pieces.prepare`, and the
local tier and the UCX peer move exactly what it returns. With ``pieces = 3`` every merged run
travels as three messages, which is easy to see in ``stats()`` (``descriptors_after``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from kvcr_policy.plugin_api import CoalescingSection, Descriptors, coalesce, hookimpl, number_field

if TYPE_CHECKING:
    from kvcr_policy.plugin_api import RegisterStrategy

__all__ = ["Pieces", "PiecesOptions", "kvcr_register_strategies"]


class PiecesOptions(BaseModel):
    """``[coalescing.options]`` of the ``pieces`` strategy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pieces: int = number_field(3, 1, 64, "Pieces each merged run is cut into.")
    merge: bool = Field(True, description="Merge contiguous runs before cutting.")


class Pieces:
    """Merge runs contiguous on both sides (if allowed), then cut each into ``pieces``."""

    def __init__(self, section: CoalescingSection, options: PiecesOptions) -> None:
        self.pieces = options.pieces
        self.merge = options.merge
        self.needs = frozenset({"split"} | ({"coalesce"} if options.merge else set()))

    def prepare(self, descriptors: Descriptors, allowed: frozenset[str]) -> Descriptors:
        if self.merge and "coalesce" in allowed:
            descriptors = coalesce(descriptors)
        if "split" not in allowed or self.pieces == 1 or len(descriptors) == 0:
            return descriptors
        d = descriptors
        n = self.pieces
        # Piece k of a run of length L starts at k*L//n and ends at (k+1)*L//n; empty pieces
        # (runs shorter than n bytes) are dropped.
        k = np.tile(np.arange(n, dtype=np.int64), len(d))
        parent = np.repeat(np.arange(len(d), dtype=np.int64), n)
        start = k * d.length[parent] // n
        end = (k + 1) * d.length[parent] // n
        keep = end > start
        parent, start, end = parent[keep], start[keep], end[keep]
        return Descriptors(
            src=d.src[parent] + start,
            dst=d.dst[parent] + start,
            length=end - start,
            bound=d.bound[parent],
            page=d.page[parent],
            page_end=d.page_end[parent],
        )


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register(
        "coalescing",
        "pieces",
        Pieces,
        options=PiecesOptions,
        description="Merge contiguous runs, then cut each into N pieces.",
    )
