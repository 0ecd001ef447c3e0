"""``kvcr-policy tune --prefill``: the engine's prefill rate, calibrated once on this host, for
the admission gate (``admission.options.prefill_curve``).

The gate compares a prefix's restore with its prefill. An engine that reports its prefill time
gives the gate a measured rate (the SGLang replay does, per request); where none is reported,
the gate reads ``prefill_curve``, which this writes: the forward pass the replay's engines
serve (:mod:`kvcr_policy.replay.prefill`: the tiny Llama of :mod:`kvcr_policy.replay.vllm_model`,
one intra-op thread) timed at each of :data:`LENGTHS` prompt tokens, median of its repeats, as
``{tokens: tokens_per_s}``. The measurement is injected (``measure``) so tests never depend on
this machine's speed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from .host import describe_host
from .setup import TuneError
from .written import render_profile

__all__ = ["LENGTHS", "calibrate", "prefill_profile", "write_prefill"]

#: Prompt lengths the curve is measured at (the gate interpolates between them, clamped).
LENGTHS: Final = (64, 256, 1024, 4096)
CURVE: Final = "admission.options.prefill_curve"


def _measured(tokens: int) -> float:
    from ..replay.prefill import prefill_seconds_per_token

    return prefill_seconds_per_token(tokens)


def _forward_seconds(tokens: int, measure: Callable[[int], float]) -> float:
    per_token = measure(tokens)
    if not 0 < per_token < float("inf"):
        length = f"{tokens} token{'' if tokens == 1 else 's'}"
        message = f"prefill calibration at {length} measured {per_token!r} s a token"
        raise TuneError(message)
    return per_token * tokens


def calibrate(
    lengths: Sequence[int] = LENGTHS, measure: Callable[[int], float] = _measured
) -> dict[int, float]:
    """``{tokens: tokens_per_s}`` at the margin: ``measure(tokens)`` gives seconds per token of
    a whole forward at that length; the rate at ``n`` is the ``n - 1`` tokens past a one-token
    forward over the seconds they add to it (its fixed part taken off)."""
    fixed = _forward_seconds(1, measure)
    curve = {}
    for tokens in lengths:
        seconds = _forward_seconds(tokens, measure) - fixed
        if not seconds > 0:
            message = (
                f"prefill calibration: a forward of {tokens} tokens measured no longer than "
                f"one of a single token ({fixed:.6g} s); the machine was too busy to measure, "
                "run tune --prefill again on a quieter host"
            )
            raise TuneError(message)
        curve[int(tokens)] = round((tokens - 1) / seconds, 1)  # the tokens past the first
    return curve


def prefill_profile(base: str, curve: dict[int, float], command: str) -> str:
    """A profile extending ``base`` with the measured curve, its evidence in the header."""
    header = [
        f"written by: {command}",
        "the engine's prefill rate on this host (tokens per second at each prompt length), "
        "calibrated once for the admission gate",
        *describe_host().lines(),
        "measured: " + ", ".join(f"{n} tokens {r:,.0f}/s" for n, r in curve.items()),
    ]
    return render_profile(base=base, values={CURVE: curve}, header=header)


def write_prefill(
    base: str, write: Path | None, command: str, measure: Callable[[int], float] = _measured
) -> str:
    """Calibrate and write the profile to ``write`` (when given); the profile's text."""
    if write is not None and write.is_dir():
        raise TuneError(f"--output: {write} is a directory; name the profile file to write")
    text = prefill_profile(base, calibrate(measure=measure), command)
    if write is not None:
        write.write_text(text, encoding="utf-8")
    return text
