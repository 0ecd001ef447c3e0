"""The replay's figures as text: one verdict line, then both runs side by side."""

from __future__ import annotations

from typing import Any

__all__ = ["render"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.1f} ms"


def render(result: dict[str, Any]) -> str:
    tier, base = result["runs"]["tier"]["measured"], result["runs"]["baseline"]["measured"]
    verdict = (
        f"{result['engine']}: TTFT p50 {_ms(result['ttft_p50_s'])} with the tier vs "
        f"{_ms(result['baseline_ttft_p50_s'])} with {result['baseline']}; prefill tokens "
        f"saved {result['prefill_tokens_saved']:,}; L3 hit tokens {result['hit_tokens']:,}, "
        f"{result['bytes_restored']:,} bytes restored; outputs identical: "
        f"{str(result['outputs_identical']).lower()}"
    )
    lines = [
        verdict,
        f"pass {result['measured_pass']} of {result['passes']} measured, "
        f"{result['requests']} requests of {result['trace']}"
        + (f"; medians of {result['repeat']} rounds" if result.get("repeat", 1) > 1 else ""),
        f"{'round 1' if result.get('repeat', 1) > 1 else '':28}"
        f"{'with the tier':>16}{'baseline':>16}",
    ]
    rows = [
        ("TTFT p50", _ms(tier["ttft_p50_s"]), _ms(base["ttft_p50_s"])),
        ("TTFT p90", _ms(tier["ttft_p90_s"]), _ms(base["ttft_p90_s"])),
        ("TTFT p99", _ms(tier["ttft_p99_s"]), _ms(base["ttft_p99_s"])),
        (
            "prefill tokens computed",
            f"{tier['prefill_tokens_computed']:,}",
            f"{base['prefill_tokens_computed']:,}",
        ),
        (
            "prefill tokens cached",
            f"{tier['prefill_tokens_cached']:,}",
            f"{base['prefill_tokens_cached']:,}",
        ),
    ]
    lines += [f"{name:28}{a:>16}{b:>16}" for name, a, b in rows]
    if "no_tier_ttft_p50_s" in result:  # --vs: the run without an L3 tier, too
        lines.append(
            f"without an L3 tier: TTFT p50 {_ms(result['no_tier_ttft_p50_s'])}, "
            f"p90 {_ms(result['no_tier_ttft_p90_s'])}"
        )
    if result.get("ttft_p50_vs_best") is not None:
        p90 = result.get("ttft_p90_vs_best")
        lines.append(
            f"with the tier over the better of the others: TTFT p50 x{result['ttft_p50_vs_best']}"
            + ("" if p90 is None else f", p90 x{p90}")
            + (" (medians of each round's own ratio)" if result.get("rounds") else "")
        )
    if result.get("ttft_paired_vs_best") is not None:
        lines.append(
            "request by request, a request's TTFT with the tier over its own in the better of "
            f"the others: median x{result['ttft_paired_vs_best']}"
        )
    for n, head in enumerate(result.get("rounds", []), 1):
        no_tier = head.get("no_tier_ttft_p50_s")
        lines.append(
            f"round {n} ({', '.join(head['order'])}): TTFT p50 {_ms(head['ttft_p50_s'])} "
            f"with the tier, {_ms(head['baseline_ttft_p50_s'])} baseline"
            + ("" if no_tier is None else f", {_ms(no_tier)} without an L3 tier")
        )
    return "\n".join(lines)
