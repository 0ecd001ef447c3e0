"""The break-even prefix of each backend: below it, recomputing a prefix beats restoring it.

The arithmetic is the admission gate's (:mod:`kvcr_policy.builtin.admission`), with nothing
queued: a prefix of ``k`` pages restores in ``k x page_bytes / rate`` and computes in
``k x page_tokens / prefill(k x page_tokens)``; the break-even is the fewest pages from which
every longer prefix, up to the plan's tokens, restores within ``(1 + margin)`` of its compute.
The prefill rate is ``--prefill-rate``, else the configured gate's (``admission.options``);
restore rates are the plan's link limit (given or measured) for the configured backend and
each ``--restore-rate NAME=RATE``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..builtin.admission import GateOptions, compute_seconds
from ..config.loading import LoadedConfig
from ..config.rates import parse_rate
from ..errors import ArgumentError

__all__ = ["BreakEven", "break_even", "gate_options", "restore_rates"]


@dataclass(frozen=True, slots=True)
class BreakEven:
    """One backend's break-even: ``tokens`` None when recomputing wins at every length up to
    ``up_to_tokens``; 0 never happens (a prefix is at least a page)."""

    backend: str
    restore_bytes_per_s: float
    rate_from: str
    tokens: int | None
    up_to_tokens: int
    restore_s_per_page: float
    compute_s_first_page: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def gate_options(loaded: LoadedConfig, prefill_rate: float | None) -> GateOptions:
    """The gate's options as configured, with ``--prefill-rate`` over its prefill rate."""
    section = loaded.config.admission
    options = dict(section.options) if section.strategy == "gate" else {}
    if prefill_rate is not None:
        options.update(prefill_tokens_per_s=prefill_rate, prefill_curve={})
    return GateOptions.model_validate(options)


def restore_rates(
    configured: str, link_gbps: float | None, link_from: str | None, given: Sequence[str]
) -> list[tuple[str, float, str]]:
    """``(backend, bytes/s, where from)``: the configured backend at the link limit (when
    known), then each ``--restore-rate NAME=RATE``."""
    rates = []
    if link_gbps:
        rates.append((configured, link_gbps * 1e9, link_from or "the link limit"))
    for text in given:
        name, _, rate = text.partition("=")
        if not name.strip() or not rate.strip():
            message = f"--restore-rate {text!r}: expected NAME=RATE (e.g. peer=50MB/s)"
            raise ArgumentError(message)
        try:
            rates.append((name.strip(), parse_rate(rate.strip()), "--restore-rate"))
        except ValueError as err:
            raise ArgumentError(f"--restore-rate {text!r}: {err}") from None
    return rates


def break_even(
    backend: str,
    rate: float,
    rate_from: str,
    page_tokens: int,
    page_bytes: int,
    up_to_tokens: int,
    options: GateOptions,
) -> BreakEven:
    """The break-even of one backend (see the module docstring)."""
    pages = max(1, up_to_tokens // page_tokens)
    k = np.arange(1, pages + 1, dtype=np.float64)
    compute = compute_seconds(k * page_tokens, options, None) * (1.0 + options.margin)
    restore = k * page_bytes / rate
    loses = np.flatnonzero(restore > compute)  # prefixes where recomputing wins
    if len(loses) == 0:
        first = 1
    elif loses[-1] + 1 == pages:
        first = 0  # recomputing wins at the longest prefix: no break-even within the plan
    else:
        first = int(loses[-1]) + 2
    return BreakEven(
        backend, rate, rate_from, first * page_tokens if first else None, pages * page_tokens,
        page_bytes / rate, float(compute[0]),
    )  # fmt: skip
