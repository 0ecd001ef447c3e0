"""Hypothesis state machines over a Pipeline on a tier of a few slots, so eviction is routine.

Two machines share the rules: one on the memory transport with the default profile (faults
injected per batch), one on the production path: the ``throughput`` profile as shipped (cpu
transport, the native copy loop with non-temporal stores, two copy threads, coalescing, split,
delivery windows), its sizes scaled down so that every one of those really acts on pages of a
few hundred bytes.

Rules: set, get, exists, delete, clear, a get whose batches fail once (sparse fallback; memory
transport only), a get paused mid-transfer while another thread churns the tier (its claim must
hold), and close (then a fresh pipeline). The model remembers a version per key: deleting or
clearing a key bumps it, so stale bytes of an earlier occupant can never pass for the key's
current bytes.

Properties: every page a get reports True holds exactly the bytes stored for that key; get's
result is the leading run ``exists`` reported; a set that fits is then fully present; deleted
keys are gone; the store never holds more than its capacity and leaves nothing reserved or
claimed between calls; after close every call raises ClosedError.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
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
)

from kvcr_policy.backends import host_copy
from kvcr_policy.backends.dram.transports.base import CopyBatch
from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.config.loading import LoadedConfig, load_config
from kvcr_policy.errors import ClosedError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.pipeline import Pipeline, build_pipeline
from kvcr_policy.plugins import make_plugin_manager
from tests.strategies import distinct_pages
from tests.support.pools import page_bytes, page_slice, token_indices
from tests.support.stateful import content, count_sequence, machine_settings, same_bytes

P = 2
PAGES = 8  # pool pages: sources and destinations are drawn from these
CAPACITY = 4  # tier slots
KEYS = [f"k{i}" for i in range(10)]
CASES = [
    ("layer_first", False),
    ("page_first", False),
    ("page_first_direct", False),
    ("page_head", False),
    ("layer_first", True),
    ("page_first", True),
    ("page_first_direct", True),
]
REGISTRY = make_plugin_manager(environ={}).registry

key_lists = st.lists(st.sampled_from(KEYS), min_size=1, max_size=CAPACITY, unique=True)


class OneShotFault:
    """Fails the next ``armed`` batches after ``cut`` descriptors, then copies normally."""

    def __init__(self) -> None:
        self.armed = 0
        self.cut = 0
        self.lock = threading.Lock()

    def __call__(self, batch: CopyBatch) -> int | None:
        with self.lock:
            if self.armed:
                self.armed -= 1
                return self.cut
        return None


class PipelineMachine(RuleBasedStateMachine):
    name = "pipeline-memory"
    head_dim = 4

    def __init__(self) -> None:
        super().__init__()
        count_sequence(self.name)
        self.pipeline: Pipeline | None = None
        self.fault: OneShotFault | None = None
        self.version = dict.fromkeys(KEYS, 0)
        self.stored: set[str] = set()  # keys that may be present: set since the last removal

    # ---- setup and teardown -----------------------------------------------------------------

    @initialize(case=st.sampled_from(CASES), batch=st.sampled_from([1, 2]))
    def open(self, case: tuple[str, bool], batch: int) -> None:
        layout, mla = case
        self.geo = PoolGeometry(
            name="kv",
            layout=layout,  # type: ignore[arg-type]
            layers=2,
            heads=1 if mla else 2,
            head_dim=self.head_dim,
            dtype="float16",
            page_size=P,
            tokens=P * PAGES,
            mla=mla,
        )
        self.batch = batch
        self._build()

    def _build(self) -> None:
        overrides = {
            "placement.capacity_bytes": CAPACITY * self.geo.page_bytes,
            "batching.read_batch_pages": self.batch,
            "batching.query_batch_keys": 2,
            "batching.window_batches": 1,  # so a get paused in on_ready holds back its rest
        }
        loaded = load_config(environ={}, overrides=overrides, registry=REGISTRY)
        self.fault = OneShotFault()
        self._open(build_pipeline(loaded, transport=MemoryTransport(fault=self.fault)))

    def _open(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.buf = np.zeros(self.geo.shape, np.float16)
        self.pipeline.register_pool("kv", self.geo, self.buf)
        self.stored.clear()

    def teardown(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()

    # ---- helpers ----------------------------------------------------------------------------

    @property
    def p(self) -> Pipeline:
        assert self.pipeline is not None
        return self.pipeline

    def write_sources(self, keys: Sequence[str], pages: Sequence[int]) -> None:
        for key, page in zip(keys, pages, strict=True):
            self.buf[page_slice(self.geo, page)] = content(self.geo, key, self.version[key])

    def garbage(self, pages: Sequence[int]) -> dict[int, bytes]:
        for page in pages:
            self.buf[page_slice(self.geo, page)] = np.float16(-7.5)
        return {page: page_bytes(self.buf, self.geo, page) for page in pages}

    def check_get(self, keys: Sequence[str], pages: Sequence[int], result: list[bool]) -> int:
        """Every True page holds the key's bytes; every False page is untouched."""
        assert len(result) == len(keys)
        run = result.index(False) if False in result else len(result)
        assert not any(result[run:]), f"get returned a True after a False: {result}"
        for key, page, ok in zip(keys, pages, result, strict=True):
            got = self.buf[page_slice(self.geo, page)].tobytes()
            if ok:
                assert key in self.stored, f"{key} was restored, but it was never stored"
                want = content(self.geo, key, self.version[key])
                same_bytes(self.name, got, want, f"{key} restored into page {page}")
        return run

    def store_stats(self) -> dict[str, int]:
        return self.p.stats().pools["kv"]["store"]

    def set_keys(self, keys: Sequence[str], pages: Sequence[int]) -> list[bool]:
        self.write_sources(keys, pages)
        result = self.p.set(keys, token_indices(pages, P))
        assert len(result) == len(keys)
        self.stored.update(key for key, ok in zip(keys, result, strict=True) if ok)
        return result

    # ---- rules ------------------------------------------------------------------------------

    @rule(keys=key_lists, data=st.data())
    def set(self, keys: list[str], data: st.DataObject) -> None:
        pages = data.draw(distinct_pages(PAGES, min_size=len(keys), max_size=len(keys)))
        # Nothing is claimed or reserved between rules, so a set of at most CAPACITY keys fits.
        assert self.set_keys(keys, pages) == [True] * len(keys)
        assert self.p.exists(keys) == len(keys)

    @precondition(lambda self: self.fault is not None)
    @rule(keys=key_lists, data=st.data(), cut=st.integers(0, 12))
    def set_through_one_failed_batch(self, keys: list[str], data: st.DataObject, cut: int) -> None:
        assert self.fault is not None
        pages = data.draw(distinct_pages(PAGES, min_size=len(keys), max_size=len(keys)))
        before = sum(self.p.stats().fallbacks.values())
        self.fault.cut, self.fault.armed = cut, 1
        assert self.set_keys(keys, pages) == [True] * len(keys)  # the per-page retry succeeds
        fired = self.fault.armed == 0  # a set of present keys copies nothing at all
        self.fault.armed = 0
        event(f"set fault fired: {fired}")
        assert self.p.exists(keys) == len(keys)
        after = sum(self.p.stats().fallbacks.values())
        assert after >= before + (1 if fired and cut == 0 else 0)
        assert after <= before + self.batch

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=6, unique=True), data=st.data())
    def get(self, keys: list[str], data: st.DataObject) -> None:
        pages = data.draw(distinct_pages(PAGES, min_size=len(keys), max_size=len(keys)))
        present = self.p.exists(keys)
        garbage = self.garbage(pages)
        result = self.p.get(keys, token_indices(pages, P))
        assert result == [True] * present + [False] * (len(keys) - present)
        self.check_get(keys, pages, result)
        for page, ok in zip(pages, result, strict=True):
            if not ok:
                assert page_bytes(self.buf, self.geo, page) == garbage[page]

    @precondition(lambda self: self.fault is not None)
    @rule(keys=key_lists, data=st.data(), cut=st.integers(0, 12))
    def get_through_one_failed_batch(self, keys: list[str], data: st.DataObject, cut: int) -> None:
        assert self.fault is not None
        pages = data.draw(distinct_pages(PAGES, min_size=len(keys), max_size=len(keys)))
        present = self.p.exists(keys)
        self.garbage(pages)
        self.fault.cut, self.fault.armed = cut, 1
        result = self.p.get(keys, token_indices(pages, P))
        self.fault.armed = 0
        # The failed batch is retried page by page, and the retries succeed.
        assert result == [True] * present + [False] * (len(keys) - present)
        self.check_get(keys, pages, result)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=6))
    def exists(self, keys: list[str]) -> None:
        count = self.p.exists(keys)
        assert 0 <= count <= len(keys)
        assert set(keys[:count]) <= self.stored
        if count < len(keys):
            assert self.p.exists(keys[count : count + 1]) == 0

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4, unique=True))
    def delete(self, keys: list[str]) -> None:
        present = sum(self.p.exists([key]) for key in keys)
        assert self.p.delete(keys) == present
        for key in keys:
            self.version[key] += 1
            self.stored.discard(key)
            assert self.p.exists([key]) == 0

    @rule()
    def clear(self) -> None:
        self.p.clear()
        for key in KEYS:
            self.version[key] += 1
        self.stored.clear()
        assert self.p.exists(KEYS[:1]) == 0
        assert self.store_stats()["keys"] == 0

    @rule(data=st.data())
    def claimed_get_survives_churn(self, data: st.DataObject) -> None:
        """A get paused after its first page holds its claim while other keys evict the rest."""
        present = [key for key in KEYS if self.p.exists([key])]
        if len(present) < 2:
            return
        keys = data.draw(
            st.lists(
                st.sampled_from(present), min_size=2, max_size=min(3, len(present)), unique=True
            )
        )
        pages = data.draw(distinct_pages(PAGES, min_size=2 * len(keys), max_size=2 * len(keys)))
        dst, src = pages[: len(keys)], pages[len(keys) :]
        self.garbage(dst)
        paused, resume = threading.Event(), threading.Event()
        outcome: list[object] = []

        def on_ready(count: int) -> None:
            if not paused.is_set():
                paused.set()
                assert resume.wait(10)

        def read() -> None:
            try:
                outcome.append(self.p.get(keys, token_indices(dst, P), on_ready=on_ready))
            except BaseException as err:  # reported by the main thread
                outcome.append(err)

        reader = threading.Thread(target=read)
        reader.start()
        try:
            assert paused.wait(10), "the get never reached on_ready"
            assert self.store_stats()["claimed"] == len(keys)
            # Fresh keys that need every unclaimed slot, and more.
            fresh = [key for key in KEYS if key not in keys][: len(src)]
            for key in fresh:  # whatever they held before is gone: new bytes, new version
                self.version[key] += 1
                self.stored.discard(key)
                self.p.delete([key])
            result = self.set_keys(fresh, src[: len(fresh)])
            room = CAPACITY - len(keys)
            assert result == [True] * min(room, len(fresh)) + [False] * max(0, len(fresh) - room)
            stats = self.store_stats()
            assert stats["claimed"] == len(keys)
            assert stats["keys"] <= CAPACITY
        finally:
            resume.set()
            reader.join(10)
        assert not reader.is_alive()
        assert outcome and not isinstance(outcome[0], BaseException), outcome
        result = outcome[0]
        assert result == [True] * len(keys)
        self.check_get(keys, dst, result)  # type: ignore[arg-type]
        event(f"claimed get of {len(keys)} pages survived churn")

    @rule()
    def close(self) -> None:
        pipeline = self.p
        pipeline.close()
        pipeline.close()
        assert pipeline.state == "closed"
        idx = token_indices([0], P)
        for call in (
            lambda: pipeline.exists(KEYS),
            lambda: pipeline.get(KEYS[:1], idx),
            lambda: pipeline.set(KEYS[:1], idx),
            lambda: pipeline.delete(KEYS[:1]),
            pipeline.clear,
        ):
            with pytest.raises(ClosedError):
                call()
        for key in KEYS:  # the next pipeline starts with an empty tier
            self.version[key] += 1
        self._build()

    # ---- invariants -------------------------------------------------------------------------

    @invariant()
    def tier_within_capacity_and_settled(self) -> None:
        if self.pipeline is None:
            return
        stats = self.store_stats()
        assert stats["capacity"] == CAPACITY
        assert stats["used"] + stats["reserved"] + stats["free"] == CAPACITY
        assert stats["keys"] == stats["used"] <= CAPACITY
        assert (stats["reserved"], stats["claimed"]) == (0, 0)
        present = {key for key in KEYS if self.p.exists([key])}
        assert present <= self.stored, (
            f"present but deleted or never stored: {present - self.stored}"
        )


# Page geometry of the throughput machine (head_dim 16): fragments of 128 bytes in layer_first
# (P·H·D·2), so a coalesced run of fragments is cut by split, and the native loop streams
# (non-temporal stores) every descriptor of at least STREAM_FROM bytes.
SPLIT_BYTES = 320
STREAM_FROM = 128


class ThroughputPipelineMachine(PipelineMachine):
    """The same rules through the production path: the ``throughput`` profile with its sizes
    scaled to these pages, so batches are small, windows bind, runs coalesce and are cut,
    both copy threads share every batch and large descriptors are streamed."""

    name = "pipeline-throughput"
    head_dim = 16

    def _build(self) -> None:
        self._open(build_pipeline(throughput_config(self.geo, self.batch)))


def throughput_config(geo: PoolGeometry, batch: int) -> LoadedConfig:
    """The ``throughput`` profile with its sizes scaled to ``geo``'s small pages."""
    page = geo.page_bytes
    overrides = {
        "placement.capacity_bytes": CAPACITY * page,
        "batching.read_batch_pages": batch,
        "batching.query_batch_keys": 2,
        "batching.window_batches": 2,
        "batching.window_bytes": 2 * batch * page,
        "coalescing.split_bytes": SPLIT_BYTES,
        "transport.stream_min_bytes": STREAM_FROM,
        # Every batch goes to both copy threads, however small (4 MiB by default).
        "transport.options.min_parallel_bytes": 0,
    }
    loaded = load_config("throughput", environ={}, overrides=overrides, registry=REGISTRY)
    config = loaded.config
    assert (config.transport.name, config.transport.threads) == ("cpu", 2)
    assert config.coalescing.strategy == "contiguous" and config.fallback.strategy == "sparse"
    return loaded


def test_the_throughput_machine_coalesces_splits_streams_and_uses_both_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The production machine's configuration is no no-op: a prefix stored together and
    restored into consecutive pages is coalesced, cut at SPLIT_BYTES, copied by the native
    loop in both copy threads, with the descriptors of at least STREAM_FROM bytes streamed."""
    if not host_copy.NATIVE:
        pytest.skip("the native copy loop did not build here (no C compiler)")
    calls: list[tuple[str, int, list[int]]] = []
    native = host_copy._copy.copy_many

    def recording(dst: int, src: int, dsts: Any, srcs: Any, lengths: Any, stream: int) -> None:
        calls.append((threading.current_thread().name, stream, list(lengths)))
        native(dst, src, dsts, srcs, lengths, stream)

    monkeypatch.setattr(host_copy._copy, "copy_many", recording)
    geo = PoolGeometry(
        name="kv", layout="layer_first", layers=2, heads=2, head_dim=16, dtype="float16",
        page_size=P, tokens=P * PAGES,
    )  # fmt: skip
    buf = np.random.default_rng(7).integers(0, 1 << 16, geo.shape, dtype=np.uint16)
    source = buf.view(np.float16)
    with build_pipeline(throughput_config(geo, 4)) as pipeline:
        pipeline.register_pool("kv", geo, source)
        keys = KEYS[:CAPACITY]
        assert pipeline.set(keys, token_indices(range(CAPACITY), P)) == [True] * CAPACITY
        assert pipeline.get(keys, token_indices(range(4, 4 + CAPACITY), P)) == [True] * CAPACITY
        stats = pipeline.stats()
    for page in range(CAPACITY):
        assert page_bytes(source, geo, 4 + page) == page_bytes(source, geo, page)
    # Per plane, 4 pages of 128-byte fragments coalesce into one 512-byte run, cut at 320: the
    # set and the get each send 2 pieces per plane instead of 4 fragments.
    planes = geo.fragments_per_page
    assert (stats.descriptors_before, stats.descriptors_after) == (2 * planes * 4, 2 * planes * 2)
    lengths = sorted({n for _, _, batch in calls for n in batch})
    assert lengths == [512 - SPLIT_BYTES, SPLIT_BYTES]
    # Each batch is shared out between the two copy threads, none copied by the caller.
    assert len(calls) == 2 * 2
    assert {name.rsplit("_", 1)[0] for name, _, _ in calls} == {"kvcr-cpu-copy"}
    if host_copy.STREAM:
        assert {stream for _, stream, _ in calls} == {STREAM_FROM}
        assert any(n >= STREAM_FROM for n in lengths)


TestPipelineMachine = PipelineMachine.TestCase
TestPipelineMachine.settings = machine_settings(30, steps=25)
TestThroughputPipelineMachine = ThroughputPipelineMachine.TestCase
TestThroughputPipelineMachine.settings = machine_settings(150, steps=25)
