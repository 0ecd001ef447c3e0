"""One vLLM run of the replay, in a process of its own (``python -m kvcr_policy.replay.vllm_run``).

Reads a job (JSON on stdin: the model folder, the prompts, the passes, the connector's
``kv_transfer_config`` or none, the file to write the result to), builds a real vLLM engine on
the CPU in this process (the engine core and the worker in-process:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, executor ``uni``; or, with ``"executor": "mp"``, the
engine core and the worker each in a process of their own, as vLLM serves at more ranks),
sends the prompts one at a time, pass after pass, and writes one JSON object: per request its
pass, prompt and cached token counts, time to first token (vLLM's own ``first_token_latency``)
and greedy output tokens, and the connector's counters after each pass (this process's: none
from a worker of its own). vLLM's log and the progress go to stdout and stderr. A process per
run, so each engine starts and ends clean.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

__all__ = ["main"]


def _engine(job: dict[str, Any]) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    transfer = job["kv_transfer_config"]
    return LLM(
        model=job["model"],
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=True,
        block_size=job["block_size"],
        max_model_len=job["max_model_len"],
        enable_prefix_caching=True,
        seed=0,
        distributed_executor_backend=job.get("executor", "uni"),
        kv_cache_memory_bytes=job["kv_cache_bytes"],
        disable_log_stats=False,
        kv_transfer_config=KVTransferConfig(**transfer) if transfer else None,
    )


def _counters() -> dict[str, int]:
    from kvcr_policy.integrations.vllm.jobs import totals

    return totals()


def run(job: dict[str, Any]) -> dict[str, Any]:
    from vllm import SamplingParams

    label = job["label"]
    started = time.perf_counter()
    llm = _engine(job)
    print(
        f"replay {label}: engine built in {time.perf_counter() - started:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    params = SamplingParams(
        temperature=0, max_tokens=job["output_tokens"], detokenize=False, ignore_eos=True
    )
    records: list[dict[str, Any]] = []
    counters: list[dict[str, int]] = []
    for number in range(job["passes"]):
        for index, tokens in enumerate(job["prompts"]):
            out = llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)[0]
            metrics = out.metrics
            records.append(
                {
                    "pass": number,
                    "request": index,
                    "prompt_tokens": len(tokens),
                    "cached_tokens": int(out.num_cached_tokens or 0),
                    "ttft_s": float(metrics.first_token_latency),
                    "output": list(out.outputs[0].token_ids),
                }
            )
        counters.append(_counters())
        print(
            f"replay {label}: pass {number + 1}/{job['passes']} done "
            f"({len(job['prompts'])} requests)",
            file=sys.stderr,
            flush=True,
        )
    return {"records": records, "counters": counters}


def main() -> None:
    job = json.loads(sys.stdin.read())
    separate = job.get("executor", "uni") == "mp"
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if separate else "0"
    result = run(job)
    with open(job["result"], "w", encoding="utf-8") as file:
        json.dump(result, file)
    # vLLM's engine threads can keep a clean exit waiting; the result is out.
    os._exit(0)


if __name__ == "__main__":
    main()
