"""What a run is made of: a checked setup, its target, backend and comparison, and the
protocols of a comparison and of its sides."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..geometry import PoolGeometry
from ..pipeline import Pipeline
from .backends import BenchBackend
from .setup import BenchSetup
from .targets import CpuTarget, CudaTarget, Pool

__all__ = ["Comparison", "Plan", "Side"]


class Side(Protocol):
    """One side of a comparison. ``pipeline`` is ours (None for a peer implementation)."""

    @property
    def label(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def path(self) -> str | None: ...

    @property
    def pipeline(self) -> Pipeline | None: ...

    def store(self, keys: list[str], tokens: np.ndarray) -> bool: ...

    def restore(self, keys: list[str], tokens: np.ndarray) -> bool: ...


class Comparison(Protocol):
    """Opens the run's pool and its sides, P and :attr:`baseline`."""

    baseline: str

    def check(self, plan: Plan) -> None: ...

    def open(self, stack: ExitStack, plan: Plan) -> tuple[Pool, dict[str, Side]]: ...

    def describe(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Plan:
    """A checked setup and the pieces that run it."""

    setup: BenchSetup
    #: The n pages one restore moves, as pool ``kv`` in host memory; the target's pool
    #: holds them (and, on ``cpu``, as many free pages to restore into).
    measured: PoolGeometry
    target: CpuTarget | CudaTarget
    backend: BenchBackend
    comparison: Comparison

    @property
    def profiles(self) -> dict[str, str]:
        """Side label -> profile, for the sides that run one of our profiles."""
        if self.comparison.baseline == "Q":
            return {"P": self.setup.profile, "Q": self.setup.vs}
        return {"P": self.setup.profile}
