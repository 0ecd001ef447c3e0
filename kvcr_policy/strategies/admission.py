"""The admission kind: how many leading present pages a lookup reports as hits.

A lookup (SGLang's ``batch_exists*``, vLLM's ``get_num_new_matched_tokens`` and its tier's
``lookup``) first counts the leading run of present pages, then asks the admission strategy
how many of them to report: a page not reported is recomputed by the engine instead of
restored. The pipeline hands the strategy what it measures live (:class:`RestoreOutlook`);
the strategy is a pure decision on those numbers, so tests drive it with injected rates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Admission", "AdmissionStrategy", "RestoreOutlook"]


@dataclass(frozen=True, slots=True)
class RestoreOutlook:
    """What the tier is delivering now, for one pipeline (one backend, one tenant).

    ``bytes_per_s``: the decayed marginal rate of this pipeline's restores (None before the
    first): the bytes a second a restore adds beyond ``restore_fixed_s``;
    ``restore_fixed_s``: the seconds a restore call takes whatever its size (its round trips,
    the claim, the wake-up of the thread that moves it), fitted apart from the rate over the
    restores; None while they cannot tell the two apart (fewer than three, or of sizes too
    alike): ``bytes_per_s`` is then their bytes over their seconds;
    ``restore_call``: the mean restore call, ``(bytes, seconds)`` (decayed), None before the
    first: at a rate known otherwise, its seconds beyond its bytes at that rate are its fixed
    part;
    ``restore_calls``: how many restores the figures rest on;
    ``queued_bytes``: bytes of restores in flight now, which a new restore waits behind;
    ``idle_s``: seconds since the last restore ended (None before the first);
    ``prefill_tokens_per_s``: the engine's marginal prefill rate where the engine reported
    its prefill (a step's fixed cost fitted apart: what computing a prefix adds to a step the
    request runs anyway); None when it did not: the strategy then uses its own calibrated or
    configured rate;
    ``prefill_s_per_token2``: with ``prefill_tokens_per_s``, the reported prefill's seconds
    per token squared (its attention: computing a prefix of ``p`` tokens adds ``p /
    prefill_tokens_per_s + prefill_s_per_token2 * p**2``); 0 where its steps fit a line;
    ``store_bytes_per_s``: the decayed marginal rate of this pipeline's stores (None before
    the first): what the link delivered the other way, before restores measured it;
    ``step_fixed_s``: where the engine times its restores from its lookup to its report that
    the load ended (vLLM), the fixed seconds of one of its steps, fitted apart from its
    prefill (None elsewhere, or before the steps tell it apart): such a restore waits for at
    least the step that reports it, so before a restore was timed it is the least a
    restore's fixed part can be.
    """

    bytes_per_s: float | None
    queued_bytes: int = 0
    idle_s: float | None = None
    prefill_tokens_per_s: float | None = None
    store_bytes_per_s: float | None = None
    restore_fixed_s: float | None = 0.0
    restore_call: tuple[float, float] | None = None
    restore_calls: int = 0
    step_fixed_s: float | None = None
    prefill_s_per_token2: float = 0.0


@dataclass(frozen=True, slots=True)
class Admission:
    """A decision: report ``pages`` leading pages as hits. ``reason`` says why they were
    admitted, ``declined`` why the others were not (labels of the
    ``kvcr_policy_admission_pages`` metric: short, from a fixed set per strategy);
    ``restore_s`` and ``compute_s`` are the expected seconds to restore and to compute all
    ``found`` pages, where the strategy estimated them (the debug log shows them); ``save``:
    whether an engine should still write the pages of a request whose every page the
    decision declined (False: the tier is too slow for any restore of them to pay, so the
    write would only hold the engine's memory; an integration that plans writes per
    request, as vLLM's, leaves them out)."""

    pages: int
    reason: str
    declined: str = ""
    restore_s: float | None = None
    compute_s: float | None = None
    save: bool = True


@runtime_checkable
class AdmissionStrategy(Protocol):
    """Decides, at lookup time, how many of the ``found`` leading present pages to report."""

    def admit(
        self, found: int, page_tokens: int, page_bytes: int, outlook: RestoreOutlook
    ) -> Admission:
        """At most ``found`` pages (of ``page_tokens`` tokens and ``page_bytes`` bytes each,
        over every pool a restore reads) to report, and why; called once per lookup, with
        ``found`` the pages present or, before the tier is asked, the pages looked up
        (:meth:`~kvcr_policy.admission.AdmissionDesk.declines`). Reporting none of ``found``
        pages must mean reporting none of any fewer: an engine then answers "no hit" without
        waiting for the tier."""
        ...
