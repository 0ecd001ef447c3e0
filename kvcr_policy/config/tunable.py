"""Tunable knobs, declared on the field they tune: candidate values or a range, as field metadata.

A config field, or a field of a strategy's, transport's or backend's options model (built-in or
third-party alike), marks itself tunable with :func:`tunable`, which goes into pydantic's
``json_schema_extra``::

    read_batch_pages: int = Field(
        128, gt=0, description="...", json_schema_extra=tunable(choices=(64, 128, 256, 512))
    )

so the JSON Schema (``kvcr-policy schema``) shows it under the key ``tunable``, and
``kvcr-policy tune`` searches it (``kvcr-policy schema --tunable`` lists every declared knob of
the registered plugins). A declaration is checked when it is made: a plugin whose declaration is
malformed fails to import and is reported like any broken plugin.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ..errors import UsageError

__all__ = ["TUNABLE_KEY", "Tunable", "field_tunable", "tunable", "tunable_fields"]

#: The key of the JSON Schema (and of ``json_schema_extra``) that holds the declaration.
TUNABLE_KEY = "tunable"
_SCALARS = (type(None), bool, int, float, str)


@dataclass(frozen=True, slots=True)
class Tunable:
    """Where a field's tuned value may go: ``choices``, or a numeric range ``low..high``.

    - ``choices``: candidate values, spelled as in a profile (``"64MiB"``, ``None`` for unset);
    - ``low``/``high`` (with ``log`` and ``step``): a numeric range;
    - ``at_most_cpus``: candidates above this host's CPU count are dropped (copy threads);
    - ``when``: the knob applies only while each named path has one of the given values (the
      ``cuda`` transport's knobs mean nothing to the ``cpu`` transport, and vice versa).
    """

    choices: tuple[Any, ...] = ()
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    step: int | float | None = None
    at_most_cpus: bool = False
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem is not None:
            raise UsageError(f"tunable(): {problem}")

    def _problem(self) -> str | None:
        ranged = self.low is not None or self.high is not None
        if bool(self.choices) == ranged:
            return "give either choices or low and high, not both and not neither"
        if self.choices:
            odd = [c for c in self.choices if not isinstance(c, _SCALARS)]
            if odd:
                return f"choices must be scalars as a profile spells them; got {odd[0]!r}"
            if len(set(map(repr, self.choices))) != len(self.choices):
                return f"choices repeat a value: {list(self.choices)}"
            return None
        if self.low is None or self.high is None or not self.low < self.high:
            return f"expected low < high, got low={self.low!r}, high={self.high!r}"
        if self.log and self.low <= 0:
            return f"a log range needs low > 0, got {self.low!r}"
        if self.log and self.step is not None:
            return "a log range takes no step"
        return None

    @property
    def integer(self) -> bool:
        """A range of whole numbers (both ends and the step are ints)."""
        ends = (self.low, self.high, self.step if self.step is not None else 1)
        return all(isinstance(v, int) and not isinstance(v, bool) for v in ends)

    def applies(self, values: Mapping[str, Any]) -> bool:
        """Whether the ``when`` conditions hold for ``values`` (flat dotted paths)."""
        return all(values.get(path) in allowed for path, allowed in self.when)

    def candidates(self, cpus: int | None = None) -> tuple[Any, ...]:
        """The choices this host allows (``at_most_cpus`` drops those above ``cpus``)."""
        if not self.at_most_cpus:
            return self.choices
        limit = cpus or os.cpu_count() or 1
        return tuple(c for c in self.choices if not isinstance(c, (int, float)) or c <= limit)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.choices:
            data["choices"] = list(self.choices)
        else:
            data.update(low=self.low, high=self.high, log=self.log)
            if self.step is not None:
                data["step"] = self.step
        if self.at_most_cpus:
            data["at_most_cpus"] = True
        if self.when:
            data["when"] = {path: list(allowed) for path, allowed in self.when}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Tunable:
        when = data.get("when") or {}
        return cls(
            choices=tuple(data.get("choices") or ()),
            low=data.get("low"),
            high=data.get("high"),
            log=bool(data.get("log", False)),
            step=data.get("step"),
            at_most_cpus=bool(data.get("at_most_cpus", False)),
            when=tuple((path, tuple(allowed)) for path, allowed in when.items()),
        )


def tunable(
    *,
    choices: Sequence[Any] = (),
    low: int | float | None = None,
    high: int | float | None = None,
    log: bool = False,
    step: int | float | None = None,
    at_most_cpus: bool = False,
    when: Mapping[str, Sequence[Any]] | None = None,
) -> dict[str, Any]:
    """The ``json_schema_extra`` of a tunable field; see :class:`Tunable` for the arguments."""
    declared = Tunable(
        choices=tuple(choices),
        low=low,
        high=high,
        log=log,
        step=step,
        at_most_cpus=at_most_cpus,
        when=tuple((path, tuple(allowed)) for path, allowed in (when or {}).items()),
    )
    return {TUNABLE_KEY: declared.to_json()}


def field_tunable(field: FieldInfo) -> Tunable | None:
    """The declaration on ``field``, if it has one."""
    extra = field.json_schema_extra
    if not isinstance(extra, Mapping) or TUNABLE_KEY not in extra:
        return None
    data = extra[TUNABLE_KEY]
    return Tunable.from_json(data) if isinstance(data, Mapping) else None


def tunable_fields(model: type[BaseModel]) -> dict[str, Tunable]:
    """Field name -> declaration, for every tunable field of ``model``, in field order."""
    found = {name: field_tunable(field) for name, field in model.model_fields.items()}
    return {name: declared for name, declared in found.items() if declared is not None}
