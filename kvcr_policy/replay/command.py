"""``kvcr-policy replay``: run the set-up, compare the two runs, print the figures."""

from __future__ import annotations

import json
import sys
from typing import Any

from .figures import compare
from .prompts import prompts
from .report import render
from .setup import ReplaySetup

__all__ = ["replay", "run_command"]


def replay(setup: ReplaySetup) -> dict[str, Any]:
    """Both runs of ``setup`` and their comparison, as the JSON ``--format json`` prints."""
    vocab, runner = _engine(setup)
    chosen = prompts(setup.trace, setup.requests, setup.block_tokens, vocab)
    print(
        f"replay: {len(chosen)} requests of {setup.trace} through {setup.engine}",
        file=sys.stderr,
        flush=True,
    )
    baseline, tier = runner(setup, chosen)
    outputs_identical = baseline.pop("outputs") == tier.pop("outputs")
    return {
        "engine": setup.engine,
        "trace": str(setup.trace),
        "requests": len(chosen),
        "passes": setup.passes,
        "measured_pass": setup.passes,
        "block_tokens": setup.block_tokens,
        "profile": setup.profile,
        "baseline": setup.vs or "no L3 tier",
        "outputs_identical": outputs_identical,
        **compare(baseline, tier),
        "runs": {"baseline": baseline, "tier": tier},
    }


def _engine(setup: ReplaySetup) -> tuple[int, Any]:
    if setup.engine == "vllm":
        from .vllm_engine import run_vllm
        from .vllm_model import VOCAB

        return VOCAB, run_vllm
    from .sglang_engine import VOCAB as SGLANG_VOCAB
    from .sglang_engine import run_sglang

    return SGLANG_VOCAB, run_sglang


def run_command(setup: ReplaySetup) -> None:
    result = replay(setup)
    if setup.format == "json":
        print(json.dumps(result, indent=2))
    else:
        print(render(result))
