"""SGLang's real HiCacheController drives the backend over the Mooncake conversation trace.

``controller_replay`` runs in a child process (it initialises torch.distributed and SGLang's
global parallel state) on each tier: the first requests of the trace, written through device ->
host -> storage by the controller's backup thread while the small host pool evicts, then the
host flushed and the same requests read back through the controller's prefetch threads. Every
page that comes back (to the host, and to the device through the controller's load path) is
compared byte for byte with the bytes derived from its key. ``controller_replay``'s docstring
names the one part that is not SGLang's on a CPU and why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.integrations.sglang.conftest import overrides_for
from tests.support.paths import ROOT, child_env

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

REQUESTS = 100
TIMEOUT_S = 420  # one tier on two busy cores takes about a minute


def replay(overrides: dict[str, Any]) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "tests.integrations.sglang.controller_replay",
        "--requests", str(REQUESTS), "--overrides", json.dumps(overrides),
    ]  # fmt: skip
    done = subprocess.run(
        command, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.returncode == 0, done.stderr[-6000:]
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


@pytest.mark.parametrize("tier", ["dram", "mooncake", "peer"])
def test_the_controller_writes_through_and_reads_back_every_page_byte_exact(
    sg: Any, tier: str, request: pytest.FixtureRequest
) -> None:
    overrides = overrides_for(tier, request)
    if tier == "mooncake":
        overrides["backend.options.segment_bytes"] = "192MiB"  # every page the run writes
    if tier == "dram":
        overrides["placement.capacity_bytes"] = "192MiB"
    figures = replay(overrides)
    assert figures["backend"] == tier
    first, second = figures["passes"]
    for run in (first, second):
        assert run["dropped_pages"] == 0 and run["mismatched_pages"] == 0, run
        assert (
            run["pages"] == run["host_hit_pages"] + run["prefetched_pages"] + run["written_pages"]
        ), run
    # The first pass writes every page it has not seen through to storage, and the host pool
    # (128 blocks) evicts all but the latest of them.
    assert first["written_pages"] > 0.9 * first["pages"]
    assert first["evicted_pages"] > 0.8 * first["written_pages"]
    # The second pass finds on the host only the pages of the block every request shares; the
    # rest come back from storage through prefetch, each checked on the host, the first ones
    # of each request also on the device.
    assert second["prefetches_with_hits"] >= 0.9 * REQUESTS
    assert second["prefetched_pages"] == second["checked_pages"]
    assert second["prefetched_pages"] > 0.5 * second["pages"]
    assert second["loaded_to_device_pages"] > 0
    counters = figures["backend_counters"]
    assert counters["pages_read"] == first["prefetched_pages"] + second["prefetched_pages"]
    assert counters["pages_written"] >= first["written_pages"]
