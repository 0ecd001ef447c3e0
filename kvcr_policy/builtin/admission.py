"""Built-in admission: 'none' (upstream: every present page is a hit) and 'gate' (restore only
a prefix that restores sooner than the engine computes it).

The gate's arithmetic, for ``k`` leading pages of ``P`` tokens and ``B`` bytes each::

    restore_s(k) = (queued_bytes + k * B) / restore_bytes_per_s
    compute_s(k) = k * P / prefill_tokens_per_s(k * P)
    admitted     = the largest k <= found with restore_s(k) <= (1 + margin) * compute_s(k)

The restore rate is the pipeline's live, decayed rate for this backend and tenant
(:class:`~kvcr_policy.strategies.RestoreOutlook`); the prefill rate is the engine's where it
reports one, else ``prefill_tokens_per_s`` (configured, or written by ``kvcr-policy tune``),
interpolated over ``prefill_curve`` where that names rates at several prompt lengths.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..config.schema import AdmissionSection
from ..hookspecs import hookimpl
from ..registry import NoOptions, RegisterStrategy
from ..strategies import Admission, RestoreOutlook

__all__ = ["GateOptions", "NoAdmission", "RestoreGate", "compute_seconds"]


class NoAdmission:
    """Every present page is reported (upstream behaviour)."""

    def __init__(self, section: AdmissionSection, options: NoOptions) -> None:
        pass

    def admit(
        self, found: int, page_tokens: int, page_bytes: int, outlook: RestoreOutlook
    ) -> Admission:
        return Admission(found, "no_gate")


class GateOptions(BaseModel):
    """Options of the ``gate`` admission strategy (``[admission.options]``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prefill_tokens_per_s: float | None = Field(
        None,
        ge=1e-3,
        le=1e9,
        allow_inf_nan=False,
        description="The engine's prefill rate, tokens per second, where the engine reports "
        "none; unset and unreported: every present page is admitted (reason no_compute_rate).",
    )
    prefill_curve: dict[
        Annotated[int, Field(gt=0, le=1 << 24)], Annotated[float, Field(ge=1e-3, le=1e9)]
    ] = Field(
        default_factory=dict,
        max_length=256,
        description="Prefill rates at several prompt lengths, {tokens: tokens_per_s}, "
        "interpolated (clamped at the ends); replaces prefill_tokens_per_s when set.",
    )
    margin: float = Field(
        0.0,
        ge=0.0,
        le=10.0,
        allow_inf_nan=False,
        description="A prefix is admitted while its restore takes at most (1 + margin) times "
        "its compute (0, or 0.001..10).",
    )
    restore_bytes_per_s: float | None = Field(
        None,
        ge=1.0,
        le=1e15,
        allow_inf_nan=False,
        description="The restore rate assumed until this pipeline measured one; unset: "
        "admit every present page until then (reason unmeasured).",
    )
    probe_after_s: float | None = Field(
        30.0,
        ge=0.01,
        le=86400,
        allow_inf_nan=False,
        description="After this long without a restore, admit one lookup's pages to measure "
        "the tier again (it may have recovered); unset: never.",
    )

    @field_validator("margin")
    @classmethod
    def _not_vanishing(cls, value: float) -> float:
        if 0 < value < 1e-3:
            raise ValueError(f"a margin is 0 or at least 0.001 (0.1 %), got {value!r}")
        return value


def compute_seconds(tokens: np.ndarray, options: GateOptions, reported: float | None) -> np.ndarray:
    """Seconds the engine takes to prefill each of ``tokens`` (an array of prompt lengths):
    at the ``reported`` rate, else over ``options.prefill_curve``, else at
    ``options.prefill_tokens_per_s``; NaN where no rate is known."""
    tokens = np.asarray(tokens, dtype=np.float64)
    if reported is not None:
        return tokens / reported
    if options.prefill_curve:
        points = sorted(options.prefill_curve.items())
        rates = np.interp(tokens, [p for p, _ in points], [r for _, r in points])
        return tokens / rates
    if options.prefill_tokens_per_s is not None:
        return tokens / options.prefill_tokens_per_s
    return np.full(tokens.shape, np.nan)


class RestoreGate:
    """The longest leading prefix that restores sooner than the engine computes it."""

    def __init__(self, section: AdmissionSection, options: GateOptions) -> None:
        self.options = options

    def admit(
        self, found: int, page_tokens: int, page_bytes: int, outlook: RestoreOutlook
    ) -> Admission:
        o = self.options
        if found <= 0:
            return Admission(0, "nothing_present")
        k = np.arange(1, found + 1, dtype=np.float64)
        compute = compute_seconds(k * page_tokens, o, outlook.prefill_tokens_per_s)
        if np.isnan(compute[-1]):
            return Admission(found, "no_compute_rate")
        rate = outlook.bytes_per_s if outlook.bytes_per_s is not None else o.restore_bytes_per_s
        if rate is None:
            return Admission(found, "unmeasured", compute_s=float(compute[-1]))
        restore = (outlook.queued_bytes + k * page_bytes) / rate
        restore_s, compute_s = float(restore[-1]), float(compute[-1])
        idle = outlook.idle_s
        if o.probe_after_s is not None and idle is not None and idle >= o.probe_after_s:
            return Admission(found, "probe", "", restore_s, compute_s)
        sooner = np.flatnonzero(restore <= (1.0 + o.margin) * compute)
        pages = int(sooner[-1]) + 1 if len(sooner) else 0
        reason = "restores_sooner" if pages else "computes_sooner"
        declined = "computes_sooner" if pages < found else ""
        return Admission(pages, reason, declined, restore_s, compute_s)


@hookimpl
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    register("admission", "none", NoAdmission)
    register(
        "admission",
        "gate",
        RestoreGate,
        options=GateOptions,
        description="Report the longest prefix that restores sooner than it computes.",
    )
