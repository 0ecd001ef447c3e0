"""What a replay reports: per run, time to first token, prefill tokens, tier hits; and the
comparison of the run with the tier against the run without it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["compare", "percentile", "summarize"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q``-th percentile (0 < q <= 100) of ``values``; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil, at least the first
    return float(ordered[int(rank) - 1])


def summarize(records: Sequence[dict[str, Any]], measured: int) -> dict[str, Any]:
    """Figures of the records of pass ``measured``."""
    chosen = [r for r in records if r["pass"] == measured]
    ttft = [r["ttft_s"] for r in chosen]
    computed = sum(r["prompt_tokens"] - r["cached_tokens"] for r in chosen)
    return {
        "requests": len(chosen),
        "ttft_p50_s": _round(percentile(ttft, 50)),
        "ttft_p90_s": _round(percentile(ttft, 90)),
        "ttft_p99_s": _round(percentile(ttft, 99)),
        "prompt_tokens": sum(r["prompt_tokens"] for r in chosen),
        "prefill_tokens_computed": computed,
        "prefill_tokens_cached": sum(r["cached_tokens"] for r in chosen),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def compare(baseline: dict[str, Any], tier: dict[str, Any]) -> dict[str, Any]:
    """The headline keys: the tier's figures, the baseline's beside them, what was saved."""
    head: dict[str, Any] = {}
    for name in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "prefill_tokens_computed"):
        head[name] = tier["measured"][name]
        head[f"baseline_{name}"] = baseline["measured"][name]
    head["prefill_tokens_saved"] = (
        baseline["measured"]["prefill_tokens_computed"]
        - tier["measured"]["prefill_tokens_computed"]
    )
    head["hit_tokens"] = tier["hit_tokens"]
    head["bytes_restored"] = tier["bytes_restored"]
    return head
