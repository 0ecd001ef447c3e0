"""One SGLang run of the replay, in a process of its own (``python -m
kvcr_policy.replay.sglang_run``): it initialises torch.distributed and SGLang's global parallel
state. Reads a job (JSON on stdin: the prompts, the passes, the prefill rate, our backend's
extra config or none, the rank, the ranks and their gloo rendezvous, MLA or not, the result
file), runs :class:`~.sglang_scheduler.Replay`, writes the
records. Progress goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys

__all__ = ["main"]


def main() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in list(os.environ):  # SGLang's test knobs never leak into a replay
        if name.startswith(("SGLANG_TEST_HICACHE", "SGLANG_HICACHE_FILE_BACKEND_")):
            del os.environ[name]
    job = json.loads(sys.stdin.read())
    from .sglang_scheduler import Replay

    rank = int(job.get("rank", 0))
    replay = Replay(
        job["extra"],
        job["prefill_s_per_token"],
        rank,
        int(job.get("ranks", 1)),
        bool(job.get("mla", False)),
        job.get("rendezvous"),
    )
    try:
        result = replay.run(job["prompts"], job["passes"])
    finally:
        replay.close()
    with open(job["result"], "w", encoding="utf-8") as file:
        json.dump(result, file)
    print(
        f"replay {job['label']}: rank {rank}: {job['passes']} passes done",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    main()
