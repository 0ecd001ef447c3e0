"""The SGLang side of the replay: the same prompts through SGLang's real ``HiCacheController``
on the CPU (:mod:`.sglang_scheduler`), once without storage and once with our backend as its L3
tier, each run a process per tensor-parallel rank (``--tp 2``: two processes, a gloo group).
The prefill rate is measured once here (:mod:`.prefill`) and shared by both runs, so they
differ only by what the tier saves.

At ``--tp 2`` the backend's ``auto`` is the host tier, one for both ranks (shared memory), as
in an SGLang server: in a folder of the run's own, stopped when the run ends. A request's TTFT
is its slower rank's, its cached tokens the fewer of the two (SGLang uses the minimum of the
ranks' hits), its output the digests of both ranks' KV.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import ReplayError
from ..integrations.sglang.config import extra_config_for
from . import children
from .engine import RunsFolder, run_figures
from .prefill import prefill_seconds_per_token
from .prompts import Prompt
from .setup import ReplaySetup

__all__ = ["VOCAB", "SGLangRuns"]

VOCAB = 32000  # token ids only feed SGLang's page hashing: any range will do
MISSING = (
    "replay --engine sglang needs sglang==0.5.23: on a CPU-only machine, from the kvcr_policy "
    "source tree, bash .ci/install-sglang.sh"
)
TIMEOUT_S = 1800
PAGE_BYTES = 4096  # sglang_stack: 2 layers x 64 tokens x 1 head x 8 dims x bf16 x (K, V)


def _capacity(prompts: list[Prompt]) -> int:
    """A tier that holds every page of the prompts, twice over (at least 64 MiB)."""
    pages = sum(len(p.tokens) // 64 for p in prompts)
    return max(64 << 20, 2 * pages * PAGE_BYTES)


def _extra(
    setup: ReplaySetup,
    profile: str | None,
    prompts: list[Prompt],
    folder: Path,
    tier: dict[str, Any],
) -> dict | None:
    if profile is None:
        return None
    overrides: dict[str, Any] = {**tier, **setup.overrides}
    if setup.tp > 1:
        overrides.setdefault("backend.options.dir", str(folder / "host-tier"))
        overrides.setdefault("backend.options.idle_exit_s", 30)
    overrides.setdefault("placement.capacity_bytes", _capacity(prompts))
    return extra_config_for(profile, overrides)


def _run(job: dict[str, Any], folder: Path, ranks: int) -> list[dict[str, Any]]:
    """One run: a process per rank; each rank's records."""
    label = job["label"]
    print(
        f"replay {label}: SGLang HiCacheController, {len(job['prompts'])} requests x "
        f"{job['passes']} passes, {ranks} rank(s)",
        file=sys.stderr,
        flush=True,
    )
    command = [sys.executable, "-m", "kvcr_policy.replay.sglang_run"]
    store = folder / f"{label}.gloo"
    jobs = [
        dict(
            job,
            rank=rank,
            ranks=ranks,
            rendezvous=str(store),
            result=str(folder / f"{label}.{rank}.json"),
        )
        for rank in range(ranks)
    ]
    procs = [
        children.start(command, stdin=subprocess.PIPE, stdout=sys.stderr, stderr=sys.stderr)
        for _ in jobs
    ]
    try:
        for proc, rank_job in zip(procs, jobs, strict=True):
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(rank_job))
            proc.stdin.close()
        codes = _wait_all(procs, label)
    finally:
        for proc in procs:  # a rank that failed leaves the others in a collective: end them,
            children.end(proc)  # and whatever each rank started (SGLang's scheduler)
    results = []
    for code, rank_job in zip(codes, jobs, strict=True):
        result_file = Path(rank_job["result"])
        if code != 0 or not result_file.exists():
            message = f"replay {label}: SGLang rank {rank_job['rank']} exited {code}; see above"
            raise ReplayError(message)
        results.append(json.loads(result_file.read_text(encoding="utf-8")))
    return results


def _wait_all(procs: list[subprocess.Popen[str]], label: str) -> list[int]:
    """Every rank's exit code; as soon as one fails, the others are not waited for."""
    deadline = time.monotonic() + TIMEOUT_S
    while any(proc.poll() is None for proc in procs):
        if any(proc.poll() not in (None, 0) for proc in procs):
            break
        if time.monotonic() > deadline:
            raise ReplayError(f"replay {label}: SGLang did not finish in {TIMEOUT_S} s")
        time.sleep(0.2)
    return [proc.returncode if proc.poll() is not None else -9 for proc in procs]


def _merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The ranks' records as one engine's: slower TTFT, fewer cached tokens, both outputs."""
    records = []
    for parts in zip(*(r["records"] for r in results), strict=True):
        merged = dict(parts[0])
        merged["ttft_s"] = max(p["ttft_s"] for p in parts)
        for name in ("cached_tokens", "host_hit_tokens", "l3_hit_tokens"):
            merged[name] = min(p[name] for p in parts)
        merged["output"] = [digest for p in parts for digest in p["output"]]
        records.append(merged)
    counters = [
        {
            name: sum(int(c[n].get(name, 0)) for c in (r["counters"] for r in results))
            for name in results[0]["counters"][n]
        }
        for n in range(len(results[0]["counters"]))
    ]
    mismatched = sum(r["mismatched_pages"] for r in results)
    return {"records": records, "counters": counters, "mismatched_pages": mismatched}


def _stop_host_tiers(folder: Path) -> None:
    """Stop the host tiers a run started in ``folder`` (their pids are in NAME.lock)."""
    for lock in folder.glob("host-tier/*.lock"):
        try:
            os.kill(int(lock.read_text().split()[0]), signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            continue


def _figures(result: dict[str, Any], label: str, passes: int) -> dict[str, Any]:
    records, counters = result["records"], result["counters"]
    measured = [r for r in records if r["pass"] == passes - 1]
    last, before = counters[-1], (counters[-2] if len(counters) > 1 else {})
    return run_figures(
        records,
        label,
        passes,
        hit_tokens=sum(r["l3_hit_tokens"] for r in measured),
        host_hit_tokens=sum(r["host_hit_tokens"] for r in measured),
        bytes_restored=int(last.get("bytes_read", 0)) - int(before.get("bytes_read", 0)),
        bytes_stored=int(last.get("bytes_written", 0)),
        mismatched_pages=result["mismatched_pages"],
        backend_counters=last,
    )


class SGLangRuns(RunsFolder):
    """The SGLang runs of a replay: the prefill rate measured once on entry and shared by
    every run, so that they differ only by what the tier saves."""

    module, missing, prefix = "sglang", MISSING, "kvcr-replay-sglang-"

    def prepare(self, root: Path) -> None:
        super().prepare(root)
        self.capacity = _capacity(self.prompts)
        self.rate = prefill_seconds_per_token()
        print(
            f"replay: prefill stand-in {self.rate * 1e6:.1f} us per token (measured)",
            file=sys.stderr,
        )

    def run(self, label: str, profile: str | None, tier: dict[str, Any]) -> dict[str, Any]:
        setup, folder = self.setup, self.folder_for(label)
        job = {
            "label": label,
            "prompts": [list(p.tokens) for p in self.prompts],
            "passes": setup.passes,
            "prefill_s_per_token": self.rate,
            "mla": setup.mla,
            "extra": _extra(setup, profile, self.prompts, folder, tier),
        }
        try:
            result = _merge(_run(job, folder, setup.tp))
        finally:
            _stop_host_tiers(folder)
        figures = _figures(result, label, setup.passes)
        figures.update(prefill_s_per_token=self.rate, tp=setup.tp, mla=setup.mla)
        return figures
