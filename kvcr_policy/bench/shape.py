"""The model a run measures: :attr:`.BenchSetup.dims`, else the preset it names."""

from __future__ import annotations

from ..geometry import PRESETS
from ..model.shape import ModelShape, ShapeOptions, resolve_shape
from .setup import BenchError, BenchSetup

__all__ = ["model_shape"]


def model_shape(setup: BenchSetup) -> ModelShape:
    """The whole model whose pages ``setup`` measures (before ``--tp`` or ``--ranks`` split
    its KV heads)."""
    if setup.dims is None:
        if setup.geometry not in PRESETS:
            names = ", ".join(sorted(PRESETS))
            raise BenchError(f"unknown geometry {setup.geometry!r}; expected one of: {names}")
        return resolve_shape(ShapeOptions(geometry=setup.geometry, mla=setup.mla))
    return ModelShape.from_dims(setup.geometry, {**setup.dims, "mla": setup.mla})
