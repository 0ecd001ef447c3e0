"""``kvcr-policy replay``: run the set-up's rounds, compare the runs, print the figures."""

from __future__ import annotations

import json
import sys
from typing import Any

from .prompts import prompts
from .report import render
from .rounds import run_rounds, summarize_rounds
from .setup import ReplaySetup

__all__ = ["replay", "run_command"]


def replay(setup: ReplaySetup) -> dict[str, Any]:
    """Every run of ``setup`` and their comparison, as the JSON ``--format json`` prints."""
    vocab, engine = _engine(setup)
    chosen = prompts(setup.trace, setup.requests, setup.block_tokens, vocab)
    print(
        f"replay: {len(chosen)} requests of {setup.trace} through {setup.engine}"
        + (f", {setup.repeat} rounds" if setup.repeat > 1 else ""),
        file=sys.stderr,
        flush=True,
    )
    with engine(setup, chosen) as runs:
        rounds = run_rounds(setup, runs)
    outputs = [run.pop("outputs") for runs_ in rounds for run in runs_.values()]
    summary = summarize_rounds(rounds)
    for runs_ in rounds:
        for run in runs_.values():
            run.pop("request_ttft_s", None)
    return {
        "engine": setup.engine,
        "trace": str(setup.trace),
        "requests": len(chosen),
        "passes": setup.passes,
        "measured_pass": setup.passes,
        "block_tokens": setup.block_tokens,
        "profile": setup.profile,
        "baseline": setup.vs or "no L3 tier",
        "backend": setup.backend,
        "tier_rate": setup.tier_rate,
        "repeat": setup.repeat,
        "outputs_identical": all(o == outputs[0] for o in outputs),
        **summary,
        "runs": rounds[0],
        **({"all_runs": rounds} if len(rounds) > 1 else {}),
    }


def _engine(setup: ReplaySetup) -> tuple[int, Any]:
    """The engine's vocabulary and its runs' context manager: ``engine(setup, prompts)``."""
    if setup.engine == "vllm":
        from .vllm_engine import VLLMRuns
        from .vllm_model import VOCAB

        return VOCAB, VLLMRuns
    from .sglang_engine import VOCAB as SGLANG_VOCAB
    from .sglang_engine import SGLangRuns

    return SGLANG_VOCAB, SGLangRuns


def run_command(setup: ReplaySetup) -> None:
    result = replay(setup)
    if setup.format == "json":
        print(json.dumps(result, indent=2))
    else:
        print(render(result))
