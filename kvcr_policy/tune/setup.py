"""What one ``kvcr-policy tune`` is asked to do: :class:`TuneSetup`, and :class:`TuneError`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..bench_adapter import BenchSetup
from ..errors import TuneError

__all__ = ["MAX_BUDGET_S", "METADATA_KEYS", "MIN_BUDGET_S", "SHAPE_KEYS", "TuneError", "TuneSetup"]

#: Keys of the metadata figure each measurement takes (the bench's ``exists``): tune ranks
#: restores only, so the figure is kept as small as the runner allows.
METADATA_KEYS = 1
#: Longest run ``tune --budget`` asks for (a week), and the least it can use (one second).
MIN_BUDGET_S, MAX_BUDGET_S = 1.0, 7 * 86400.0
#: The model dimensions ``[profile.tune]`` records beside ``geometry`` (its name).
SHAPE_KEYS = ("layers", "heads", "head_dim", "dtype", "page_size")


@dataclass(frozen=True, slots=True)
class TuneSetup:
    """The bench's axes, the starting profile, and how long and how hard to search."""

    start: str = "throughput"
    geometry: str = "qwen3-32b"
    layout: str = "layer_first"
    tokens: int = 8192
    target: str = "cpu"
    backend: str | None = None
    mla: bool = False
    scatter: bool = False
    #: ``--set`` values: applied to both sides of every measurement, never tuned or written.
    overrides: Mapping[str, Any] = field(default_factory=dict)
    #: Wall-clock seconds for the whole command: search and confirmation.
    budget_s: float = 300.0
    #: Restores per side and order when confirming (and for ``--remeasure``).
    repeat: int = 9
    #: Restores per side and order of each search trial.
    trial_repeat: int = 3
    #: Search only these knobs (dotted paths); empty: every knob that applies.
    only: tuple[str, ...] = ()
    seed: int = 0
    #: The regression screen, in percent, that a written profile must pass in both orders.
    screen_pct: float = 5.0
    #: The model's page shape (:attr:`.BenchSetup.dims`); None: the preset ``geometry``.
    dims: Mapping[str, Any] | None = None
    #: ``--tp``: the tensor-parallel size whose rank's shard is measured.
    tp: int | None = None

    def bench(self, profile: str, vs: str, repeat: int) -> BenchSetup:
        """One measured comparison of ``profile`` (P) against ``vs`` (Q) on these axes."""
        return BenchSetup(
            profile,
            vs,
            self.geometry,
            self.layout,
            self.tokens,
            repeat,
            self.mla,
            self.scatter,
            dict(self.overrides),
            target=self.target,
            backend=self.backend,
            exists_keys=METADATA_KEYS,
            dims=None if self.dims is None else dict(self.dims),
            tp=self.tp,
        )

    def record(self) -> dict[str, Any]:
        """The axes as ``[profile.tune]`` records them, for ``tune --remeasure``."""
        return {
            "target": self.target,
            "backend": self.backend,
            "geometry": self.geometry,
            "layout": self.layout,
            "tokens": self.tokens,
            "mla": self.mla,
            "scatter": self.scatter,
            **{key: (self.dims or {}).get(key) for key in SHAPE_KEYS},
            "tp": self.tp,
            "set": {key: str(value) for key, value in self.overrides.items()},
        }
