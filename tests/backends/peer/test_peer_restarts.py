"""Recovery after every kill: ``kill -9`` of ``serve`` at any moment, a restart on the same
address, and the same client process stores and restores again, quiet and under a CPU hog.

Each kill is proven to land where it means to before it is dealt: during data sends (the
server has receives posted for a store in flight: ``tenant_receiving``, seen by another client
of the tenant), during claims (a claim outstanding for a restore in flight), during a handshake
(the server stopped with the client's connect under way), or between calls. After each restart
the client must store, then restore byte-exact, within its own limits: a connect and handshake
(``connect_timeout_s``) and attaching its pools again (``op_timeout_s``, at least
``ATTACH_TIMEOUT_S``), with no restart of the client process.

These run on a quiet machine; the soak at the end does the same under the CPU hog, cycling
through every moment, and checks between calls that the server holds no claim or reservation:
16 cycles in the suite, as many as ``KVCR_SOAK_CYCLES`` says by hand (the 50-cycle soak:
``KVCR_SOAK_CYCLES=50 python -m pytest -n 0 -s tests/backends/peer/test_peer_restarts.py -k soak``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.backends.peer.client.client import ATTACH_TIMEOUT_S
from kvcr_policy.backends.peer.client.pool import ANSWER_GRACE_S
from tests.backends.peer.peer_helpers import SERVER_SETS, big_geometry, need_ucxx, promised_s
from tests.support.load import TEST_HOG_S, CpuHog
from tests.support.pools import fresh_keys, pages_of, pool_buffer, token_indices
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.ucx, pytest.mark.slow]

#: Kills during data sends in a row, per load.
KILLS_DURING_SENDS = 20
#: Kill-and-restart cycles of the soak (under the hog): 4 per moment unless told otherwise.
SOAK_CYCLES = int(os.environ.get("KVCR_SOAK_CYCLES", "16"))
PAGES = 64


@dataclass
class Rig:
    """A server on a fixed port that a test kills and restarts, a client pipeline on it, and an
    observer (another client of the tenant) that sees what the server holds."""

    port: str = ""
    server: Any = None
    pipeline: Any = None
    observer: Any = None
    geo: Any = None
    view: Any = None
    recoveries: list[float] = field(default_factory=list)
    verified: int = 0  # pages restored and compared byte for byte

    def start(self) -> None:
        from kvcr_policy.backends.peer.process import PeerProcess

        listen = f"127.0.0.1:{self.port or 0}"
        self.server = PeerProcess(SERVER_SETS, listen=listen, timeout=120.0)
        self.port = self.server.address.rsplit(":", 1)[1]

    def kill(self) -> None:
        self.server.proc.send_signal(signal.SIGKILL)
        self.server.proc.wait()

    def held(self) -> dict[str, int]:
        """What the server holds on the tier right now (the observer asks)."""
        remote = self.observer.stats().to_dict()["pools"]["kv"]["peer"]["remote"]
        tier, server = remote["tier"], remote["server"]
        return {
            "claimed": tier["claimed"],
            "reserved": tier["reserved"],
            "receiving": server["tenant_receiving"],
        }

    def pages(self, first: int, count: int) -> np.ndarray:
        return token_indices(range(first, first + count), self.geo.page_size)

    def store_and_restore(self) -> None:
        """After a restart: a store succeeds within the client's own limits, then its pages
        restore byte-exact."""
        options = self.pipeline.config.transport.options
        bound = options["connect_timeout_s"] + max(
            self.pipeline.config.transport.op_timeout_s, ATTACH_TIMEOUT_S
        )
        keys = fresh_keys(8)
        started = time.monotonic()
        wait_until(
            lambda: all(self.pipeline.set(keys, self.pages(0, 8), "kv")),
            "a store through the reconnected client",
            bound,
            every=0.05,
        )
        self.recoveries.append(time.monotonic() - started)
        self.view[:, PAGES : PAGES + 8] = 0
        assert all(self.pipeline.get(keys, self.pages(PAGES, 8), "kv"))
        assert np.array_equal(self.view[:, PAGES : PAGES + 8], self.view[:, :8])
        self.verified += 8


@pytest.fixture
def rig() -> Iterator[Rig]:
    need_ucxx()
    rig = Rig()
    rig.start()
    overrides = {
        "transport.name": "ucx",
        "transport.options.peer": rig.server.address,
        "transport.options.shared_memory": "off",
        "transport.options.heartbeat_s": 0.5,
        "transport.op_timeout_s": 5,
    }
    rig.geo = big_geometry("kv")
    buffer = pool_buffer(rig.geo, 11)
    rig.view = pages_of(buffer, rig.geo)
    try:
        rig.pipeline = build_pipeline(load_config(overrides=overrides))
        rig.pipeline.register_pool("kv", rig.geo, buffer)
        rig.observer = build_pipeline(load_config(overrides=overrides))
        rig.observer.register_pool("kv", rig.geo, np.zeros(rig.geo.shape, np.float16))
        yield rig
    finally:
        for pipeline in (rig.pipeline, rig.observer):
            if pipeline is not None:
                pipeline.close()
        if rig.server is not None and rig.server.proc.poll() is None:
            rig.server.stop()


class Loop:
    """A thread that stores (or restores) back to back until a call misses; every page a
    restore reports present must be byte-exact."""

    def __init__(self, rig: Rig, what: str) -> None:
        self.rig, self.what = rig, what
        self.wrong: list[int] = []
        self.calls = 0
        self.keys = fresh_keys(PAGES)
        assert all(rig.pipeline.set(self.keys, rig.pages(0, PAGES), "kv"))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rig, n = self.rig, PAGES
        while True:
            if self.what == "store":
                got = rig.pipeline.set(fresh_keys(n), rig.pages(0, n), "kv")
            else:
                rig.view[:, n : 2 * n] = 0
                got = rig.pipeline.get(self.keys, rig.pages(n, n), "kv")
                arrived = np.flatnonzero(got)
                self.wrong += [
                    int(i)
                    for i in arrived
                    if not np.array_equal(rig.view[:, n + i], rig.view[:, i])
                ]
                rig.verified += len(arrived)
            self.calls += 1
            if not all(got):
                return

    def end(self, bound: float) -> None:
        self.thread.join(bound)
        assert not self.thread.is_alive(), f"a {self.what} hung more than {bound} s after the kill"
        assert not self.wrong, f"pages reported present differ from those stored: {self.wrong}"


def bound_after_kill(rig: Rig) -> float:
    """docs/peer.md: a call in flight at a kill misses within op_timeout_s, and the answer grace."""
    return promised_s(rig.pipeline.config) + ANSWER_GRACE_S


def kill_during(rig: Rig, moment: str) -> None:
    """Kill the server at ``moment`` (proven in flight), restart it, and check recovery."""
    if moment in ("sends", "claims"):
        loop = Loop(rig, "store" if moment == "sends" else "restore")
        wanted = "receiving" if moment == "sends" else "claimed"
        wait_until(
            lambda: rig.held()[wanted] > 0 or not loop.thread.is_alive(),
            f"the server holding {wanted} for a call in flight",
            bound_after_kill(rig),
            every=0,
        )
        assert loop.thread.is_alive(), f"the {loop.what}s ended before the kill landed"
        rig.kill()
        loop.end(bound_after_kill(rig))
    elif moment == "handshake":
        rig.kill()  # the client's connection ends; its next call connects again
        rig.start()
        rig.server.proc.send_signal(signal.SIGSTOP)  # the kernel accepts; nobody answers
        stop = threading.Event()

        def call() -> None:
            while not stop.is_set():
                rig.pipeline.exists(["x"], "kv")

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        try:
            wait_until(
                lambda: rig.pipeline.backend.describe()["connecting"],
                "the client's connect and handshake under way",
                bound_after_kill(rig),
                every=0,
            )
            rig.kill()
        finally:
            stop.set()
            caller.join(rig.pipeline.config.transport.options["connect_timeout_s"] + 5)
        assert not caller.is_alive(), "a call hung after the server died mid-handshake"
    else:
        rig.kill()
    rig.start()
    rig.store_and_restore()
    assert wait_until(
        lambda: rig.held() == {"claimed": 0, "reserved": 0, "receiving": 0},
        "no claim, reservation or posted receive left on the server between calls",
        promised_s(rig.pipeline.config),
        ignore=(Exception,),
    )


def test_a_server_killed_during_data_sends_recovers_every_time(rig: Rig) -> None:
    for _ in range(KILLS_DURING_SENDS):
        kill_during(rig, "sends")
    assert len(rig.recoveries) == KILLS_DURING_SENDS
    connects = rig.pipeline.backend.describe()["connects"]
    assert connects >= KILLS_DURING_SENDS + 1  # one client process, reconnected each time


@pytest.mark.parametrize("moment", ["claims", "handshake", "idle"])
def test_a_server_killed_at_any_moment_recovers(rig: Rig, moment: str) -> None:
    for _ in range(2):
        kill_during(rig, moment)


def test_soak_kills_and_restarts_under_the_hog(
    rig: Rig, record_property: Callable[[str, object], None]
) -> None:
    moments = ["sends", "claims", "handshake", "idle"]
    with CpuHog(seconds=TEST_HOG_S):
        for cycle in range(SOAK_CYCLES):
            kill_during(rig, moments[cycle % len(moments)])
    links = rig.pipeline.backend.describe()["links"]
    summary = (
        f"soak: {SOAK_CYCLES} kills and restarts under the hog, "
        f"{rig.verified} pages verified byte for byte, worst recovery {max(rig.recoveries):.2f} s "
        f"(median {sorted(rig.recoveries)[len(rig.recoveries) // 2]:.2f} s), "
        f"client links open {links['links_open']}, frozen {links['links_frozen']}, "
        "server claims and reservations left 0"
    )
    record_property("soak", summary)
    print(summary)
    assert links["links_open"] <= 4  # the two pipelines' live links, never one per kill
