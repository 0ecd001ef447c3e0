"""Built-in coalescing: 'none' (one descriptor per fragment) and 'contiguous' (merge runs)."""

from __future__ import annotations

from ..config.schema import CoalescingSection
from ..descriptors import Descriptors, coalesce, split
from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterStrategy

__all__ = ["Contiguous", "NoCoalescing"]


class NoCoalescing:
    """Upstream behaviour: one descriptor per fragment; split sizing only if configured."""

    def __init__(self, section: CoalescingSection, options: NoOptions) -> None:
        self.limit = int(section.split_bytes) if section.split_bytes is not None else None
        self.needs = frozenset({"split"} if self.limit is not None else ())

    def prepare(self, descriptors: Descriptors, allowed: frozenset[str]) -> Descriptors:
        if self.limit is not None and "split" in allowed:
            return split(descriptors, self.limit)
        return descriptors


class Contiguous(NoCoalescing):
    """Merge descriptors contiguous on both sides (never across a boundary), then split."""

    def __init__(self, section: CoalescingSection, options: NoOptions) -> None:
        super().__init__(section, options)
        self.needs = self.needs | {"coalesce"}

    def prepare(self, descriptors: Descriptors, allowed: frozenset[str]) -> Descriptors:
        if "coalesce" in allowed:
            descriptors = coalesce(descriptors)
        return super().prepare(descriptors, allowed)


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register("coalescing", "none", NoCoalescing, description="One descriptor per fragment.")
    register(
        "coalescing",
        "contiguous",
        Contiguous,
        description="Merge runs contiguous in source and destination; cut at split_bytes.",
    )
