"""A Hypothesis state machine over the UCX peer: a real ``kvcr-policy serve`` and real ucxx.

Each sequence opens a pipeline with ``transport.name = "ucx"`` (the ``default`` profile, or
``throughput`` with small batches, windows and a split that cuts coalesced runs on the wire)
on a pool of one layout, against a server whose tier holds CAPACITY pages, so every set beyond
it evicts. Rules: set, get, exists, delete, clear, reconnect (a new client finds the pages the
old one stored) and restart (SIGTERM the server, start a new one on the same port: the client
reconnects by itself and the tier starts empty).

Properties: every page a get reports present holds exactly the bytes stored for that key (a
version per key, bumped by delete, clear and restart, so stale bytes never pass); pages it
reports missing are untouched; get's leading run is the one ``exists`` reported; a set of at
most CAPACITY keys is then fully present, evicts at least the overflow and makes no other key
appear; between calls the server's tier holds no claim and no reservation and never more than
CAPACITY pages.

A set cut into batches reserves per batch on the peer, its first RESERVE naming the set's other
keys for the server to keep for the whole call (the others name only the call), so, as in the
local store, no batch evicts a key another batch of the same set holds: the machine asserts
that every eviction of a set was needed for its overflow.
(A get whose batches are in flight together reports only the leading run on every backend: the
mover cuts what arrived after a miss.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.backends.peer.server.tiers import SLOT_COST
from kvcr_policy.geometry import PoolGeometry
from tests.backends.peer.peer_helpers import Serve, need_ucxx
from tests.strategies import distinct_pages
from tests.support.pools import geometry, page_slice, token_indices
from tests.support.stateful import content, count_sequence, machine_settings, same_bytes
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.ucx, pytest.mark.slow]

P = 2
PAGES = 8
CAPACITY = 4
PAGE_BYTES = 256  # every case below: MHA 2·L·P·H·D·2 = MLA L·P·D·2
#: A server tier counts a page smaller than SLOT_COST as SLOT_COST against its capacity.
TIER_BYTES = CAPACITY * max(PAGE_BYTES, SLOT_COST)
KEYS = [f"k{i}" for i in range(9)]
CASES = [
    ("layer_first", False),
    ("page_first", False),
    ("page_first_direct", False),
    ("page_head", False),
    ("layer_first", True),
    ("page_first", True),
    ("page_first_direct", True),
]
SERVER_SETS = {
    "transport.name": "ucx",
    "transport.op_timeout_s": 10,
    "placement.capacity_bytes": TIER_BYTES,
    "transport.options.heartbeat_s": 0.5,
}
SETTLE_S = 10.0  # the server's op_timeout_s: a claim is released by then at the latest

key_lists = st.lists(st.sampled_from(KEYS), min_size=1, max_size=CAPACITY, unique=True)


def case_geometry(layout: str, mla: bool) -> PoolGeometry:
    """The pool of one case: 2 layers, head dim 8 (32 for MLA), so every page is PAGE_BYTES."""
    geo = geometry(layout, mla=mla, layers=2, head_dim=32 if mla else 8, page_size=P, pages=PAGES)
    assert geo.page_bytes == PAGE_BYTES
    return geo


class Server:
    """The one server of this module's machine, restarted in place by the restart rule."""

    serve: Serve | None = None

    @classmethod
    def address(cls) -> str:
        if cls.serve is None:
            cls.serve = Serve(SERVER_SETS)
        return cls.serve.address

    @classmethod
    def restart(cls) -> None:
        assert cls.serve is not None
        port = cls.serve.port
        assert cls.serve.stop() == 0, "\n".join(cls.serve.log[-20:])
        cls.serve = Serve(SERVER_SETS, listen=f"127.0.0.1:{port}")

    @classmethod
    def stop(cls) -> None:
        if cls.serve is not None:
            code = cls.serve.stop()
            log = "\n".join(cls.serve.log[-20:])
            cls.serve = None
            assert code == 0, log


@pytest.fixture(scope="module", autouse=True)
def _server() -> Iterator[None]:
    need_ucxx()
    yield
    Server.stop()


class PeerMachine(RuleBasedStateMachine):
    name = "peer"

    def __init__(self) -> None:
        super().__init__()
        count_sequence(self.name)
        self.pipeline: Any = None
        self.version = dict.fromkeys(KEYS, 0)
        self.stored: set[str] = set()  # keys that may be present
        self.restarted = False

    @initialize(
        case=st.sampled_from(CASES),
        profile=st.sampled_from(["default", "throughput"]),
        batch=st.sampled_from([1, 2]),
    )
    def open(self, case: tuple[str, bool], profile: str, batch: int) -> None:
        self.geo = case_geometry(*case)
        self.overrides: dict[str, Any] = {
            "transport.name": "ucx",
            "transport.options.heartbeat_s": 0.5,
            "transport.op_timeout_s": 10,
            "batching.read_batch_pages": batch,
            "batching.query_batch_keys": 2,
        }
        if profile == "throughput":
            # Coalesced runs on the wire are cut at 96 bytes (fragments are 32-128 bytes).
            self.overrides.update({"batching.window_batches": 2, "coalescing.split_bytes": 96})
        self.profile = profile
        self.buf = np.zeros(self.geo.shape, np.float16)
        self._connect()
        self.p.clear()  # the tier outlives sequences: start this one empty
        for key in KEYS:
            self.version[key] += 1

    def _connect(self) -> None:
        overrides = {**self.overrides, "transport.options.peer": Server.address()}
        self.pipeline = build_pipeline(load_config(self.profile, overrides=overrides))
        self.pipeline.register_pool("kv", self.geo, self.buf)

    def teardown(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()

    # ---- helpers ----------------------------------------------------------------------------

    @property
    def p(self) -> Any:
        assert self.pipeline is not None
        return self.pipeline

    def tier(self) -> dict[str, int]:
        peer = self.p.stats().pools["kv"]["peer"]
        assert "remote" in peer, peer
        return peer["remote"]["tier"]

    def present(self) -> set[str]:
        return {key for key in KEYS if self.p.exists([key]) == 1}

    def fill(self, keys: Sequence[str], pages: Sequence[int]) -> None:
        for key, page in zip(keys, pages, strict=True):
            self.buf[page_slice(self.geo, page)] = content(self.geo, key, self.version[key])

    def garbage(self, pages: Sequence[int]) -> dict[int, bytes]:
        for page in pages:
            self.buf[page_slice(self.geo, page)] = np.float16(-3.25)
        return {page: self.buf[page_slice(self.geo, page)].tobytes() for page in pages}

    def check_get(self, keys: Sequence[str], pages: Sequence[int]) -> list[bool]:
        present = self.p.exists(keys)
        garbage = self.garbage(pages)
        result = self.p.get(keys, token_indices(pages, P))
        assert len(result) == len(keys)
        run = result.index(False) if False in result else len(result)
        assert run == present, f"get's leading run {result} is not the {present} exists found"
        assert not any(result[run:]), f"get reported pages after the first miss: {result}"
        for key, page, ok in zip(keys, pages, result, strict=True):
            got = self.buf[page_slice(self.geo, page)].tobytes()
            if ok:
                assert key in self.stored, f"{key} was restored, but it was never stored"
                want = content(self.geo, key, self.version[key])
                same_bytes(self.name, got, want, f"{key} restored into page {page}")
            elif got != garbage[page]:
                # A batch in flight past the first miss may land (it is not reported): only
                # the stored bytes of that very key may appear there, never anything else.
                assert key in self.stored, f"page {page} of missing {key} was written"
                want = content(self.geo, key, self.version[key])
                same_bytes(self.name, got, want, f"{key} landed past the first miss")
                event("a batch past the first miss landed (not reported)")
        return result

    # ---- rules ------------------------------------------------------------------------------

    @rule(keys=key_lists, data=st.data())
    def set(self, keys: list[str], data: st.DataObject) -> None:
        pages = data.draw(distinct_pages(PAGES, min_size=len(keys), max_size=len(keys)))
        before = self.present()
        evictions = self.tier()["evictions"]
        self.fill(keys, pages)
        assert self.p.set(keys, token_indices(pages, P)) == [True] * len(keys)
        self.stored.update(keys)
        after = self.present()
        needed = len(set(keys) - before)
        overflow = max(0, needed - (CAPACITY - len(before)))
        assert set(keys) <= after
        assert after - set(keys) <= before - set(keys)  # nothing else appeared
        evicted = self.tier()["evictions"] - evictions
        assert len(before - after) >= overflow and evicted >= overflow
        assert evicted == overflow, f"the set evicted {evicted} pages for {overflow} it needed"

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=6, unique=True), data=st.data())
    def get(self, keys: list[str], data: st.DataObject) -> None:
        pages = data.draw(distinct_pages(PAGES, min_size=len(keys), max_size=len(keys)))
        result = self.check_get(keys, pages)
        event(f"get restored {sum(result)} of {len(keys)}")

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=6))
    def exists(self, keys: list[str]) -> None:
        present = self.present()
        assert present <= self.stored, f"present but never stored or gone: {present - self.stored}"
        count = self.p.exists(keys)
        assert 0 <= count <= len(keys)
        assert set(keys[:count]) <= self.stored
        if count < len(keys):
            assert self.p.exists(keys[count : count + 1]) == 0

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
    def delete(self, keys: list[str]) -> None:
        present = self.present()
        assert self.p.delete(keys) == len(present & set(keys))
        for key in keys:
            self.version[key] += 1
            self.stored.discard(key)
        assert not self.present() & set(keys)

    @rule()
    def clear(self) -> None:
        self.p.clear()
        for key in KEYS:
            self.version[key] += 1
        self.stored.clear()
        assert self.tier()["keys"] == 0

    @rule()
    def reconnect(self) -> None:
        """A new client (a new pipeline) finds every page the old one stored, byte for byte."""
        present = sorted(self.present())
        self.p.close()
        self.pipeline = None
        self._connect()
        assert self.present() == set(present)
        pages = list(range(len(present)))
        assert self.check_get(present, pages) == [True] * len(present)

    @precondition(lambda self: not self.restarted)
    @rule(now=st.integers(0, 3))
    def restart(self, now: int) -> None:
        """SIGTERM the server and start a new one on its port: the client reconnects by itself,
        misses while the peer is away, and finds an empty tier. A restart costs a process start
        (about 2 s), so a quarter of the draws restart and each sequence restarts at most once."""
        if now:
            return
        self.restarted = True
        Server.restart()
        for key in KEYS:
            self.version[key] += 1
        self.stored.clear()
        sentinel, page = ["reconnected"], [0]
        wait_until(
            lambda: self.p.set(sentinel, token_indices(page, P)) == [True],
            "the client reconnected after a restart",
            20,
            every=0.1,
        )
        assert self.p.delete(sentinel) == 1
        assert self.present() == set()
        assert self.p.stats().pools["kv"]["peer"]["connects"] >= 2

    # ---- invariants -------------------------------------------------------------------------

    @invariant()
    def tier_settled_and_within_capacity(self) -> None:
        if self.pipeline is None:
            return

        # A read's claim is released when the server's sends complete, just after the client's
        # receives did: give it until the server's op_timeout_s, as docs/peer.md promises.
        def settled() -> dict[str, int] | None:
            tier = self.tier()
            return None if tier["claimed"] or tier["reserved"] else tier

        tier = wait_until(
            settled,
            "no claim or reservation left on the tier",
            SETTLE_S,
            every=0.005,
        )
        assert tier["capacity"] == CAPACITY
        assert tier["keys"] == tier["used"] <= CAPACITY


def test_peer_machine() -> None:
    run_state_machine_as_test(PeerMachine, settings=machine_settings(80, steps=10))


# ---- where the peer path breaks the local contract (see the module docstring) -------------------


def two_pipelines(geo: PoolGeometry, buf: np.ndarray) -> list[Any]:
    """The local DRAM tier and the peer, both with one page per batch and no window bound."""
    base = {"batching.read_batch_pages": 1}
    # CAPACITY pages each: the local tier counts a page as its bytes, the server's as at least
    # SLOT_COST (the server's own tier, whose capacity_bytes is TIER_BYTES, is the peer's).
    local = build_pipeline(
        load_config(
            "default", overrides={**base, "placement.capacity_bytes": CAPACITY * PAGE_BYTES}
        )
    )
    peer = build_pipeline(
        load_config(
            "default",
            overrides={**base, "transport.name": "ucx", "transport.options.peer": Server.address()},
        )
    )
    for pipeline in (local, peer):
        pipeline.register_pool("kv", geo, buf)
        pipeline.clear()
    return [local, peer]


@pytest.mark.parametrize("where", ["local", "peer"])
def test_a_get_reports_only_the_leading_run(where: str) -> None:
    geo = case_geometry("layer_first", False)
    buf = np.zeros(geo.shape, np.float16)
    pipelines = two_pipelines(geo, buf)
    try:
        pipeline = pipelines[["local", "peer"].index(where)]
        assert pipeline.set(["b"], token_indices([0], P)) == [True]
        assert pipeline.get(["a", "b"], token_indices([1, 2], P)) == [False, False]
    finally:
        for pipeline in pipelines:
            pipeline.close()


def evictions(pipeline: Any) -> int:
    pool = pipeline.stats().pools["kv"]
    return int(
        pool["peer"]["remote"]["tier"]["evictions"]
        if "peer" in pool
        else pool["store"]["evictions"]
    )


@pytest.mark.parametrize(
    "where",
    [
        "local",
        "peer",
    ],
)
def test_a_set_never_evicts_its_own_present_keys(where: str) -> None:
    geo = case_geometry("layer_first", False)
    buf = np.zeros(geo.shape, np.float16)
    pipelines = two_pipelines(geo, buf)
    try:
        pipeline = pipelines[["local", "peer"].index(where)]
        assert pipeline.set(["k0"], token_indices([0], P)) == [True]
        assert pipeline.set(["k1", "k2", "k3"], token_indices([1, 2, 3], P)) == [True] * 3
        before = evictions(pipeline)
        # The tier is full, k0 is its least recently used key, and this set holds it: one
        # eviction (k1) makes room for k4; k0 stays where it is.
        assert pipeline.set(["k4", "k0"], token_indices([4, 0], P)) == [True, True]
        assert {key for key in ["k0", "k1", "k2", "k3", "k4"] if pipeline.exists([key])} == {
            "k0", "k2", "k3", "k4",
        }  # fmt: skip
        assert evictions(pipeline) == before + 1
    finally:
        for pipeline in pipelines:
            pipeline.close()
