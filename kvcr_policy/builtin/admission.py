"""Built-in admission: 'none' (upstream: every present page is a hit) and 'gate' (restore only
a prefix that restores sooner than the engine computes it).

The gate's arithmetic, for ``k`` leading pages of ``P`` tokens and ``B`` bytes each::

    restore_s(k) = fixed_s + (queued_bytes + k * B) / restore_bytes_per_s
    compute_s(k) = k * P / prefill_tokens_per_s(k * P)
    admitted     = the largest k <= found with restore_s(k) <= (1 + margin) * compute_s(k)

The restore figures are the pipeline's live, decayed ones for this backend and tenant
(:class:`~kvcr_policy.strategies.RestoreOutlook`): ``seconds = fixed_s + bytes / rate``
fitted over its restores, since a restore call pays its round trips and wake-ups once, whatever
its length (a rate of bytes over seconds would charge a long prefix for them page by page and
a short one too little); the queued bytes are its restores and stores in flight. Until the
restores tell the two apart (three of sizes different enough), ``restore_bytes_per_s`` where
configured, else the marginal rate this pipeline's stores measured over the same link, is the
rate, and what the mean restore took beyond it the fixed part (:func:`restore_figures`: one
slow call cannot decline every later lookup, which would restore, so measure, nothing); with
neither, the restores' own rate, and until three restores a lookup it would decline reports a
probe of ``probe_pages`` pages, as after ``probe_after_s`` without a restore. With no figure
at all, a lookup reports at most ``probe_pages`` pages, a probe of bounded cost. The prefill
is the engine's where it reports one (``compute_s(k) = k * P / prefill_tokens_per_s +
prefill_s_per_token2 * (k * P)**2``: its attention's cost fitted apart where its steps tell
it, :mod:`~kvcr_policy.observability.prefill_cost`, so a short prefix is not priced at a long
one's rate), else ``prefill_curve`` (configured, or calibrated by ``kvcr-policy tune
--prefill`` on this host), else ``prefill_tokens_per_s`` (configured).
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..config.fields import number_field
from ..config.schema import AdmissionSection
from ..hookspecs import hookimpl
from ..observability.marginal import MIN_SAMPLES
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

    prefill_tokens_per_s: float | None = number_field(
        None,
        1e-3,
        1e9,
        "The engine's prefill rate, tokens per second, where the engine reports none and "
        "prefill_curve is unset; none at all: every present page is admitted (reason "
        "no_compute_rate).",
        finite=True,
    )
    prefill_curve: dict[
        Annotated[int, Field(gt=0, le=1 << 24)], Annotated[float, Field(ge=1e-3, le=1e9)]
    ] = Field(
        default_factory=dict,
        max_length=256,
        description="Prefill rates at several prompt lengths, {tokens: tokens_per_s}, "
        "interpolated (clamped at the ends); replaces prefill_tokens_per_s when set "
        "(kvcr-policy tune --prefill measures one on this host).",
    )
    margin: float = number_field(
        0.0,
        -0.9,
        10.0,
        "A prefix is admitted while its restore takes at most (1 + margin) times its compute "
        "(0, 0.001..10, or -0.9..-0.001). Negative: a restore must be that "
        "share sooner than computing, for what it costs the engine beyond the restored "
        "request's wait (on a host whose cores the tier and the engine share, the load takes "
        "CPU from the prefill of the others).",
    )
    restore_bytes_per_s: float | None = number_field(
        None,
        1.0,
        1e15,
        "The restore rate assumed until this pipeline measured one; unset: the rate its "
        "stores measured, else at most probe_pages pages a lookup (reason unmeasured).",
        finite=True,
    )
    probe_after_s: float | None = number_field(
        30.0,
        0.01,
        86400,
        "After this long without a restore, admit a probe of at most probe_pages pages to "
        "measure the tier again (it may have recovered); unset: never.",
    )
    probe_pages: int = number_field(
        8,
        1,
        1 << 20,
        "The most pages a lookup reports while no restore rate is known, and in a probe: a "
        "tier of unknown speed costs at most this many pages' restore.",
    )

    save_when_declined: bool = Field(
        False,
        description="Write the pages of a request whose every prefix the gate declines (the "
        "tier restores none of them sooner than they compute); false leaves them out, so the "
        "engine keeps no memory for writes no restore would use (vLLM holds a request's "
        "blocks until they are written). A probe that finds the tier faster writes again.",
    )

    @field_validator("margin")
    @classmethod
    def _not_vanishing(cls, value: float) -> float:
        if 0 < abs(value) < 1e-3:
            raise ValueError(f"a margin is 0 or at least 0.001 (0.1 %) either way, got {value!r}")
        return value


def _first(*rates: float | None) -> float | None:
    """The first rate known: measured restores, configured, measured stores."""
    return next((rate for rate in rates if rate is not None), None)


def restore_figures(
    outlook: RestoreOutlook, configured: float | None
) -> tuple[float | None, float, bool]:
    """``(bytes per second, fixed seconds a restore, early)`` the gate decides on.

    The restores' fit where it told their fixed seconds apart from their rate. Else the
    prior, ``configured`` or the stores' marginal rate, with the seconds the mean restore
    took beyond its bytes at that rate as its fixed part (before any restore, the engine
    step's fixed seconds where the engine times its restores, ``step_fixed_s``, else none:
    the run's first restore on vLLM, 384 tokens admitted on the stores' rate alone, took 2 to
    3.5 times its compute, a step's wait for its load): a slow restore makes a short prefix
    dearer, never a long one declined on the strength of a call's round trips, so long
    prefixes keep restoring and their sizes soon tell the two apart (a declined lookup
    restores nothing, so measures nothing). With no prior, the restores' own bytes over
    seconds (``early``: until :data:`MIN_SAMPLES` restores, a lookup it would decline
    restores a probe instead); None: nothing known."""
    rate, fixed = outlook.bytes_per_s, outlook.restore_fixed_s
    if rate is not None and fixed is not None:
        return rate, fixed, False
    prior = _first(configured, outlook.store_bytes_per_s)
    if prior is None:
        return rate, 0.0, rate is not None and outlook.restore_calls < MIN_SAMPLES
    call = outlook.restore_call if rate is not None else None
    if call is None:  # no restore timed yet: at least the engine step that reports one
        return prior, outlook.step_fixed_s or 0.0, False
    return prior, max(0.0, call[1] - call[0] / prior), False


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

    def _stale(self, idle_s: float | None) -> bool:
        """Whether the measured rate is old enough to probe the tier again."""
        after = self.options.probe_after_s
        return after is not None and idle_s is not None and idle_s >= after

    def admit(
        self, found: int, page_tokens: int, page_bytes: int, outlook: RestoreOutlook
    ) -> Admission:
        o = self.options
        if found <= 0:
            return Admission(0, "nothing_present")
        reported = outlook.prefill_tokens_per_s
        constant = reported if reported is not None else o.prefill_tokens_per_s
        if constant is None and not o.prefill_curve:
            return Admission(found, "no_compute_rate")
        probe = min(found, o.probe_pages)
        rate, fixed, early = restore_figures(outlook, o.restore_bytes_per_s)
        if reported is None and o.prefill_curve:  # the rate varies with the length: each k
            k = np.arange(1, found + 1, dtype=np.float64)
            compute = compute_seconds(k * page_tokens, o, None)
            compute_s = float(compute[-1])
            if rate is None:
                return self._unmeasured(found, probe, compute_s)
            restore = fixed + (outlook.queued_bytes + k * page_bytes) / rate
            sooner = np.flatnonzero(restore <= (1.0 + o.margin) * compute)
            pages = int(sooner[-1]) + 1 if len(sooner) else 0
            restore_s = float(restore[-1])
        else:
            # One rate (and the reported attention term, 0 or more): restore_s(k) - (1 +
            # margin) compute_s(k) is concave in k and not below 0 at k = 0 (the fixed and
            # queued seconds), so where it is above 0 at k = found it is above 0 at every k
            # between: the longest prefix that restores sooner is every page or none (O(1)).
            assert constant is not None
            tokens = found * page_tokens
            quadratic = outlook.prefill_s_per_token2 if reported is not None else 0.0
            compute_s = tokens / constant + max(quadratic, 0.0) * tokens * tokens
            if rate is None:
                return self._unmeasured(found, probe, compute_s)
            restore_s = fixed + (outlook.queued_bytes + found * page_bytes) / rate
            pages = found if restore_s <= (1.0 + o.margin) * compute_s else 0
        if pages < probe and (early or self._stale(outlook.idle_s)):  # or it recovered
            declined = "computes_sooner" if probe < found else ""
            return Admission(probe, "probe", declined, restore_s, compute_s)
        reason = "restores_sooner" if pages else "computes_sooner"
        declined = "computes_sooner" if pages < found else ""
        save = bool(pages) or o.save_when_declined
        return Admission(pages, reason, declined, restore_s, compute_s, save)

    @staticmethod
    def _unmeasured(found: int, probe: int, compute_s: float) -> Admission:
        """A tier of unknown speed: a bounded probe measures it."""
        declined = "unmeasured" if probe < found else ""
        return Admission(probe, "unmeasured", declined, compute_s=compute_s)


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
