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
        f"{result['requests']} requests of {result['trace']}",
        f"{'':28}{'with the tier':>16}{'baseline':>16}",
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
    return "\n".join(lines)
