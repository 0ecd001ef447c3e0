"""The search space of ``kvcr-policy tune``: the tunable knobs that apply to a starting config.

A knob is a field declared tunable where it lives (:mod:`kvcr_policy.config.tunable`): a
section field of the schema, or a field of the options model of the strategy, transport or
backend the config names, whoever provides it. Built-in and third-party declarations are read
the same way, from the registry of the load.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, cast

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from ..config.loading import LoadedConfig
from ..config.schema import STRATEGY_SECTIONS, PolicyConfig
from ..config.sources import flatten
from ..config.tunable import Tunable, tunable_fields
from ..registry import Registry, Spec
from .setup import TuneError

__all__ = ["Declared", "Knob", "declared_knobs", "field_adapter", "search_space"]

#: Who declares the knobs of the schema itself.
CORE = "kvcr-policy"


@dataclass(frozen=True)
class Knob:
    """One tunable value of a starting config: its path, its candidates and its start."""

    path: str
    declared: Tunable
    #: The starting config's value, as JSON (``model_dump(mode="json")``).
    start: Any
    #: Who declares it: ``kvcr-policy`` or a plugin's distribution and strategy.
    owner: str
    #: Validates one value as the field does (its type and bounds).
    adapter: TypeAdapter[Any] = field(repr=False, compare=False)

    def normal(self, value: Any) -> Any:
        """``value`` validated by the field and dumped as JSON (``"64MiB"`` -> 67108864)."""
        return self.adapter.dump_python(self.adapter.validate_python(value), mode="json")

    def same(self, value: Any) -> bool:
        """Whether ``value`` is the starting value, however it is spelled."""
        return bool(self.normal(value) == self.start)

    def choices(self, cpus: int | None = None) -> tuple[Any, ...]:
        """The candidates: declared ones this host and the field accept, and the start.

        ``None`` (unset) is left out when the start is set: TOML has no null, so a profile
        cannot unset what its base sets.
        """
        if not self.declared.choices:
            return ()
        found: list[Any] = []
        seen: list[Any] = []
        for value in self.declared.candidates(cpus):
            if value is None and self.start is not None:
                continue
            try:
                normal = self.normal(value)
            except ValidationError:
                continue  # a bound tighter than the declaration (or than this host)
            if normal not in seen:
                seen.append(normal)
                found.append(value)
        if self.start not in seen:
            found.append(self.start)
        return tuple(found)

    def suggest(self, trial: Any, cpus: int | None = None) -> Any:
        """Ask an optuna trial for this knob's value."""
        d = self.declared
        if d.choices:
            return trial.suggest_categorical(self.path, list(self.choices(cpus)))
        assert d.low is not None and d.high is not None  # Tunable checks a range's ends
        if d.integer:
            step = int(d.step) if d.step is not None else 1
            return trial.suggest_int(self.path, int(d.low), int(d.high), step=step, log=d.log)
        return trial.suggest_float(self.path, float(d.low), float(d.high), step=d.step, log=d.log)


@dataclass(frozen=True)
class Declared:
    """A declaration as ``kvcr-policy schema --tunable`` lists it."""

    path: str
    owner: str
    declared: Tunable
    #: When it applies beyond ``declared.when``: the strategy, transport or backend chosen.
    chosen: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {"path": self.path, "owner": self.owner, **self.declared.to_json()}
        if self.chosen is not None:
            data["chosen"] = self.chosen
        return data


def _named(config: PolicyConfig, registry: Registry) -> Iterator[tuple[str, Spec]]:
    """Each section with an options model, and the spec the config names there."""
    for section, kind in STRATEGY_SECTIONS.items():
        yield section, registry.get(kind, getattr(config, section).strategy)
    yield "transport", registry.get("transport", config.transport.name)
    backend = registry.backend_for(config.backend.name, config.transport.name)
    yield "backend", registry.get("backend", backend)


def _owner(spec: Spec) -> str:
    return f"{spec.distribution} ({spec.kind} {spec.name!r})"


def field_adapter(info: FieldInfo) -> TypeAdapter[Any]:
    """A validator of one value of the field ``info`` describes: its type and its bounds."""
    # The FieldInfo as Annotated metadata carries the field's constraints (gt, le, ...).
    # (cast: a type built at run time is not a static TypeForm for mypy with pydantic >= 2.14)
    return TypeAdapter(cast(Any, Annotated[info.annotation, info]))


def _fields(model: type[BaseModel]) -> Iterator[tuple[str, Tunable, TypeAdapter[Any]]]:
    for name, declared in tunable_fields(model).items():
        yield name, declared, field_adapter(model.model_fields[name])


def search_space(
    loaded: LoadedConfig,
    *,
    fixed: Collection[str] = (),
    only: Collection[str] = (),
    cpus: int | None = None,
) -> list[Knob]:
    """The knobs of ``loaded`` worth searching: declared tunable, applying to this config
    (``when``), not ``fixed`` (values ``--set`` pins on every side), in ``only`` when given,
    and with at least two candidates on this host.
    """
    config, registry = loaded.config, loaded.registry
    assert registry is not None  # every load_config result carries the registry it used
    values = flatten(config.model_dump(mode="json"))
    knobs: list[Knob] = []
    for section, section_field in PolicyConfig.model_fields.items():
        model = section_field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for name, declared, info in _fields(model):
            path = f"{section}.{name}"
            knobs.append(Knob(path, declared, values.get(path), CORE, info))
    for section, spec in _named(config, registry):
        options = getattr(config, section).options
        for name, declared, info in _fields(spec.options):
            path = f"{section}.options.{name}"
            knobs.append(Knob(path, declared, options.get(name), _owner(spec), info))
    unknown = sorted(set(only) - {k.path for k in knobs})
    if unknown:
        names = ", ".join(k.path for k in knobs) or "none"
        message = (
            f"--only names no tunable knob of this config: {', '.join(unknown)} (tunable here: "
            f"{names}; `kvcr-policy schema --tunable` lists every declaration)"
        )
        raise TuneError(message)
    cpus = cpus or os.cpu_count() or 1
    return [
        k
        for k in knobs
        if k.declared.applies(values)
        and k.path not in fixed
        and (not only or k.path in only)
        and (not k.declared.choices or len(k.choices(cpus)) >= 2)
    ]


def declared_knobs(registry: Registry) -> list[Declared]:
    """Every tunable declaration: the schema's, then each registered options model's."""
    found: list[Declared] = []
    for section, section_field in PolicyConfig.model_fields.items():
        model = section_field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for name, declared, _ in _fields(model):
            found.append(Declared(f"{section}.{name}", CORE, declared))
    for spec in sorted(registry.specs.values(), key=lambda s: (s.kind, s.name)):
        key = "strategy" if spec.kind in STRATEGY_SECTIONS else "name"  # sections: kind names
        for name, declared, _ in _fields(spec.options):
            chosen = f"{spec.kind}.{key} = {spec.name!r}"
            found.append(Declared(f"{spec.kind}.options.{name}", _owner(spec), declared, chosen))
    return found
