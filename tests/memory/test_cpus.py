"""The CPUs of a process, and threads moved onto them whatever thread started them.

Real threads, real ``sched_setaffinity``: a thread pinned to one CPU stands in for an engine's
compute thread (vLLM's CPU worker pins the thread that builds its connector). Two CPUs are
needed to pin a thread narrower than its process.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from kvcr_policy.memory.cpus import cpu_list, process_cpus, spread_thread
from tests.support.cpus import needs_two_cpus, on_pinned_thread
from tests.support.paths import ROOT


@needs_two_cpus
def test_the_process_keeps_every_cpu_of_its_threads_when_one_thread_is_pinned() -> None:
    everything = os.sched_getaffinity(0)
    first = min(everything)
    # From a thread pinned to one CPU, the process still has every CPU the others may use.
    assert on_pinned_thread(first, process_cpus) == everything


@needs_two_cpus
def test_a_thread_started_from_a_pinned_thread_is_spread_over_the_process() -> None:
    everything = os.sched_getaffinity(0)
    first = min(everything)

    def start_a_thread() -> tuple[set[int], set[int]]:
        seen: list[set[int]] = []

        def child() -> None:
            seen.append(os.sched_getaffinity(0))  # inherited from the pinned thread
            spread_thread()
            seen.append(os.sched_getaffinity(0))

        thread = threading.Thread(target=child)
        thread.start()
        thread.join(30)
        return seen[0], seen[1]

    inherited, spread = on_pinned_thread(first, start_a_thread)
    assert inherited == {first}
    assert spread == everything


def test_cpu_lists_read_as_the_kernel_writes_them() -> None:
    assert cpu_list([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert cpu_list([5]) == "5"
    assert cpu_list([]) == ""


# Threads that never run inside an engine's process: the bench's own measuring threads (one
# share per CPU of the calling thread, on purpose), its progress line and helper processes'
# pipe drainers, the conformance suite's test thread, and the server's address checker (in
# `serve`, which an operator starts, or in a host tier, which runs on its starter's CPUs).
NOT_IN_AN_ENGINE = {
    "kvcr_policy/bench/host_copy.py",
    "kvcr_policy/bench/progress.py",
    "kvcr_policy/backends/peer/process.py",
    "kvcr_policy/testing/checks.py",
    "kvcr_policy/backends/peer/server/addrcheck.py",
    "kvcr_policy/backends/peer/server/server.py",
}


def test_every_thread_kvcr_policy_starts_in_an_engine_is_spread() -> None:
    """A thread started from an engine's pinned thread inherits its one CPU: each module that
    starts threads spreads them (``spread_thread`` first, or as a pool's initializer)."""
    unspread = []
    for path in sorted((ROOT / "kvcr_policy").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        starts = re.findall(r"threading\.Thread\(|ThreadPoolExecutor\(", text)
        if starts and name not in NOT_IN_AN_ENGINE:
            spreads = text.count("spread_thread()") + text.count("initializer=spread_thread")
            if spreads < len(starts):
                unspread.append(f"{name}: {len(starts)} thread starts, {spreads} spread")
    assert not unspread, unspread
    assert all((ROOT / Path(name)).exists() for name in NOT_IN_AN_ENGINE)
