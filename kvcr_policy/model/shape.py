"""The model geometry ``plan``, ``bench`` and ``tune`` take: one set of options, one resolution.

A page's shape comes from, in rising precedence: a preset (``--geometry qwen3-32b``), a
model's Hugging Face ``config.json`` (``--model-config PATH``, :mod:`.hf_config`), and each
explicit dimension (``--layers``, ``--heads``, ``--head-dim``, ``--dtype``, ``--page-size``,
``--mla/--mha``). Every value keeps where it came from, so a refusal or a report names it; a
value that replaces one from a preset or a config says so (``--layers, over --geometry
small's 16``). An MLA pool has one latent head. ``--tp`` (the tensor-parallel size) divides
the KV heads, each command applying it to what it measures or plans.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ArgumentError
from ..geometry import DTYPE_ITEMSIZE, PRESETS, Layout, PoolGeometry

__all__ = ["DIMS", "ModelShape", "ShapeOptions", "resolve_shape"]

#: The dimensions a page's shape needs besides ``mla``.
DIMS = ("layers", "heads", "head_dim", "dtype", "page_size")


@dataclass(frozen=True, slots=True)
class ShapeOptions:
    """The geometry options of one command line, as given (None: not given)."""

    geometry: str | None = None
    layers: int | None = None
    heads: int | None = None
    head_dim: int | None = None
    dtype: str | None = None
    page_size: int | None = None
    mla: bool | None = None
    model_config: Path | None = None
    #: The tensor-parallel size: the KV heads are divided by it.
    tp: int | None = None

    def explicit(self) -> dict[str, Any]:
        """The dimensions given one by one (``mla`` too), without the unset ones."""
        given = {key: getattr(self, key) for key in (*DIMS, "mla")}
        return {key: value for key, value in given.items() if value is not None}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A model's page shape: dimensions of the whole model (before tensor parallelism)."""

    name: str
    layers: int
    heads: int
    head_dim: int
    dtype: str
    page_size: int
    mla: bool = False
    #: Field -> where its value came from.
    origins: Mapping[str, str] = field(default_factory=dict, compare=False)

    def dims(self) -> dict[str, Any]:
        """The dimensions as plain values (``mla`` included)."""
        return {key: getattr(self, key) for key in (*DIMS, "mla")}

    def pool(self, layout: Layout, tokens: int, *, device: str = "cpu") -> PoolGeometry:
        """A pool of ``tokens`` tokens of this shape, named for the model."""
        return PoolGeometry(
            name=self.name, layout=layout, tokens=tokens, device=device, **self.dims()
        )

    @classmethod
    def from_dims(cls, name: str, dims: Mapping[str, Any]) -> ModelShape:
        """A shape from :meth:`dims` (as recorded), or a preset's when ``dims`` is empty."""
        if dims:
            return cls(name=name, **{key: dims[key] for key in (*DIMS, "mla") if key in dims})
        return resolve_shape(ShapeOptions(geometry=name))


def _check_preset(name: str) -> None:
    if name not in PRESETS:
        message = (
            f"--geometry {name!r}: expected one of {', '.join(PRESETS)}, or the model's own "
            "dimensions (--model-config PATH, or --layers --heads --head-dim --dtype --page-size)"
        )
        raise ArgumentError(message)


def resolve_shape(options: ShapeOptions, *, default: str | None = None) -> ModelShape:
    """The page shape ``options`` describe; the preset ``default`` (with its origin spelled
    out) when they name no preset, no config and no dimension. Missing dimensions, an unknown
    preset or dtype, and an MLA pool of several heads are refused with one message."""
    fields: dict[str, tuple[Any, str]] = {"mla": (False, "default (MHA)")}
    name = "custom"
    preset = options.geometry
    preset_from = f"--geometry {preset}"
    unnamed = preset is None and options.model_config is None
    if unnamed and default is not None and not options.explicit().keys() - {"mla"}:
        preset, preset_from = default, f"default (--geometry {default})"
    if preset is not None:
        _check_preset(preset)
        name = preset
        for key, value in PRESETS[preset].items():
            fields[key] = (value, preset_from)
    if options.model_config is not None:
        from .hf_config import read_model_config

        name, found = read_model_config(options.model_config)
        for key, (value, origin) in found.items():
            fields[key] = _over(fields, key, value, origin)
    for key, value in options.explicit().items():
        option = "--mla" if key == "mla" and value else "--mha" if key == "mla" else key
        fields[key] = _over(fields, key, value, f"--{option.lstrip('-').replace('_', '-')}")
    mla, mla_from = fields["mla"]
    if mla:
        heads = fields.get("heads")
        if options.heads is not None and options.heads != 1:
            message = (
                f"--heads {options.heads} with an MLA pool (from {mla_from}): MLA keeps one "
                "latent head per token; give --heads 1 or drop it (--mha for an MHA pool)"
            )
            raise ArgumentError(message)
        if heads is None or heads[0] != 1:
            fields["heads"] = (1, f"{mla_from}: one latent head")
    missing = [key for key in DIMS if key not in fields]
    if missing:
        message = (
            f"a model geometry is needed: give --geometry ({', '.join(PRESETS)}), "
            "--model-config PATH (a Hugging Face config.json), or each of --layers --heads "
            f"--head-dim --dtype --page-size (missing: {', '.join(missing)})"
        )
        raise ArgumentError(message)
    dtype, dtype_from = fields["dtype"]
    if dtype not in DTYPE_ITEMSIZE:
        known = ", ".join(DTYPE_ITEMSIZE)
        message = f"--dtype {dtype!r} (from {dtype_from}): expected one of {known}"
        raise ArgumentError(message)
    values = {key: value for key, (value, _) in fields.items()}
    origins = {key: origin for key, (_, origin) in fields.items()}
    return ModelShape(name=name, **values, origins=origins)


def _over(
    fields: Mapping[str, tuple[Any, str]], key: str, value: Any, origin: str
) -> tuple[Any, str]:
    """``(value, origin)``, the origin naming the value it replaces, if it differs."""
    before = fields.get(key)
    if before is not None and before[0] != value and not before[1].startswith("default (MHA"):
        origin = f"{origin}, over {before[1]}'s {before[0]}"
    return value, origin
