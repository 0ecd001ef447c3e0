"""The SGLang side of the replay: the same prompts through SGLang's real ``HiCacheController``
on the CPU (:mod:`.sglang_scheduler`), once without storage and once with our backend as its L3
tier, each run a process of its own. The prefill rate is measured once here (:mod:`.prefill`)
and shared by both runs, so they differ only by what the tier saves.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from ..errors import ReplayError
from ..integrations.sglang.config import extra_config_for
from .figures import summarize
from .prefill import prefill_seconds_per_token
from .prompts import Prompt
from .setup import ReplaySetup

__all__ = ["VOCAB", "run_sglang"]

VOCAB = 32000  # token ids only feed SGLang's page hashing: any range will do
MISSING = (
    "replay --engine sglang needs sglang==0.5.23: on a CPU-only machine, from the kvcr_policy "
    "source tree, bash .ci/install-sglang.sh"
)
TIMEOUT_S = 1800
PAGE_BYTES = 4096  # sglang_stack: 2 layers x 64 tokens x 1 head x 8 dims x bf16 x (K, V)


def _extra(setup: ReplaySetup, profile: str | None, prompts: list[Prompt]) -> dict | None:
    if profile is None:
        return None
    overrides = dict(setup.overrides)
    if "placement.capacity_bytes" not in overrides:
        pages = sum(len(p.tokens) // 64 for p in prompts)
        overrides["placement.capacity_bytes"] = max(64 << 20, 2 * pages * PAGE_BYTES)
    return extra_config_for(profile, overrides)


def _run(job: dict[str, Any], folder: Path) -> dict[str, Any]:
    label = job["label"]
    job = dict(job, result=str(folder / f"{label}.json"))
    print(
        f"replay {label}: SGLang HiCacheController, {len(job['prompts'])} requests x "
        f"{job['passes']} passes",
        file=sys.stderr,
        flush=True,
    )
    command = [sys.executable, "-m", "kvcr_policy.replay.sglang_run"]
    try:
        done = subprocess.run(
            command,
            input=json.dumps(job),
            text=True,
            stdout=sys.stderr,
            stderr=sys.stderr,
            timeout=TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ReplayError(f"replay {label}: SGLang did not finish in {TIMEOUT_S} s") from None
    result_file = Path(job["result"])
    if done.returncode != 0 or not result_file.exists():
        raise ReplayError(f"replay {label}: the SGLang run exited {done.returncode}; see above")
    result: dict[str, Any] = json.loads(result_file.read_text(encoding="utf-8"))
    return result


def _figures(result: dict[str, Any], label: str, passes: int) -> dict[str, Any]:
    records, counters = result["records"], result["counters"]
    measured = [r for r in records if r["pass"] == passes - 1]
    last, before = counters[-1], (counters[-2] if len(counters) > 1 else {})
    return {
        "label": label,
        "measured": summarize(records, passes - 1),
        "passes": [summarize(records, n) for n in range(passes)],
        "hit_tokens": sum(r["l3_hit_tokens"] for r in measured),
        "host_hit_tokens": sum(r["host_hit_tokens"] for r in measured),
        "bytes_restored": int(last.get("bytes_read", 0)) - int(before.get("bytes_read", 0)),
        "bytes_stored": int(last.get("bytes_written", 0)),
        "mismatched_pages": result["mismatched_pages"],
        "backend_counters": last,
        "outputs": [r["output"] for r in records],
    }


def run_sglang(setup: ReplaySetup, prompts: list[Prompt]) -> tuple[dict, dict]:
    """(the run without the tier or with ``--vs``, the run with ``--profile``)."""
    if find_spec("sglang") is None:
        raise ReplayError(MISSING)
    if setup.tp != 1 or setup.mla:
        raise ReplayError("replay --engine sglang: --tp 2 and --mla are not available yet")
    rate = prefill_seconds_per_token()
    print(f"replay: prefill stand-in {rate * 1e6:.1f} us per token (measured)", file=sys.stderr)
    runs = []
    with tempfile.TemporaryDirectory(prefix="kvcr-replay-sglang-") as name:
        for label, profile in (("baseline", setup.vs), ("tier", setup.profile)):
            job = {
                "label": label,
                "prompts": [list(p.tokens) for p in prompts],
                "passes": setup.passes,
                "prefill_s_per_token": rate,
                "extra": _extra(setup, profile, prompts),
            }
            figures = _figures(_run(job, Path(name)), label, setup.passes)
            figures["prefill_s_per_token"] = rate
            runs.append(figures)
    return runs[0], runs[1]
