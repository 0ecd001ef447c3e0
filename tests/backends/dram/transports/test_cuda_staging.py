"""Tests for the staging ring's stream order and its index buffers, without a GPU.

This machine has no GPU, so CUDA is faked here (and only here): :class:`FakeCuda` runs the
ring's real code with every copy and index kernel enqueued on simulated streams, which run
them in a random order that keeps only what the code asked for: stream order, and each
``wait_event`` / ``wait_stream`` on work recorded before it. Some enqueued work runs while
more is enqueued, as a GPU's would, so an event queried early reads "not yet". A missing wait
between a fill and its scatter, a buffer refilled before its scatter ran, or an index buffer
written while its upload was pending then shows as wrong bytes. The tensors are real (CPU);
the bytes are checked against one copy per descriptor. The same paths run on a GPU in
test_cuda.py.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcr_policy.backends.dram.transports.cuda_index import MIN_ROWS, IndexBuffers
from kvcr_policy.backends.dram.transports.cuda_options import CudaOptions
from kvcr_policy.backends.dram.transports.cuda_paths import CopyPaths
from kvcr_policy.backends.dram.transports.cuda_plan import page_pieces, plan_staging, row_unit
from kvcr_policy.backends.dram.transports.cuda_staging import StagingRing
from kvcr_policy.descriptors import Descriptors

torch = pytest.importorskip("torch")


class FakeStream:
    """Work in order; ``done`` counts what ran."""

    def __init__(self, gpu: FakeCuda) -> None:
        self.gpu, self.work, self.done = gpu, [], 0
        self.cuda_stream = 0  # one copy_ per piece (no batch call), as without the runtime

    def head_ready(self) -> bool:
        if self.done == len(self.work):
            return False
        after = self.work[self.done][1]
        return after is None or after[0].done >= after[1]

    def enqueue(self, run: Callable[[], None] | None, after: Any = None) -> None:
        self.work.append((run, after))
        self.gpu.progress()

    def wait_event(self, event: FakeEvent) -> None:
        if event.at is not None:
            self.enqueue(None, event.at)

    def wait_stream(self, other: FakeStream) -> None:
        self.enqueue(None, (other, len(other.work)))

    def synchronize(self) -> None:
        self.gpu.run_until(lambda: self.done == len(self.work))

    def query(self) -> bool:
        return self.done == len(self.work)


class FakeEvent:
    def __init__(self, gpu: FakeCuda) -> None:
        self.gpu, self.at = gpu, None

    def record(self, stream: FakeStream | None = None) -> None:
        stream = stream or self.gpu.current
        self.at = (stream, len(stream.work))

    def query(self) -> bool:
        return self.at is None or self.at[0].done >= self.at[1]

    def synchronize(self) -> None:
        self.gpu.run_until(self.query)


class FakeCuda:
    """``torch.cuda`` for the ring: streams that run enqueued work in a random valid order."""

    def __init__(self, seed: int, eager: float) -> None:
        self.random, self.eager = random.Random(seed), eager
        self.streams: list[FakeStream] = []
        self.current = self.Stream()

    def Stream(self, device: int | None = None) -> FakeStream:
        stream = FakeStream(self)
        self.streams.append(stream)
        return stream

    def Event(self) -> FakeEvent:
        return FakeEvent(self)

    @contextlib.contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    @contextlib.contextmanager
    def device(self, index: int) -> Iterator[None]:
        yield

    def step(self) -> bool:
        ready = [s for s in self.streams if s.head_ready()]
        if not ready:
            return False
        stream = self.random.choice(ready)
        run = stream.work[stream.done][0]
        if run is not None:
            run()
        stream.done += 1
        return True

    def progress(self) -> None:
        while self.random.random() < self.eager and self.step():
            pass

    def run_until(self, finished: Callable[[], bool]) -> None:
        while not finished():
            assert self.step(), "a wait that nothing recorded before it can satisfy: deadlock"


class FakeTensor:
    """A CPU tensor whose copies and index kernels run on the current fake stream."""

    def __init__(self, gpu: FakeCuda, real: Any) -> None:
        self.gpu, self.real = gpu, real

    def __getitem__(self, key: Any) -> FakeTensor:
        return FakeTensor(self.gpu, self.real[key])

    def view(self, *shape: Any) -> FakeTensor:
        return FakeTensor(self.gpu, self.real.view(*shape))

    def numel(self) -> int:
        return int(self.real.numel())

    def data_ptr(self) -> int:
        return int(self.real.data_ptr())

    def numpy(self) -> np.ndarray:  # pinned host memory: written by the CPU at once
        return self.real.numpy()

    def copy_(self, src: Any, non_blocking: bool = False) -> None:
        dst, source = self.real, src.real if isinstance(src, FakeTensor) else src
        self.gpu.current.enqueue(lambda: dst.copy_(source))

    def index_copy_(self, dim: int, index: FakeTensor, source: FakeTensor) -> None:
        dst = self.real
        self.gpu.current.enqueue(lambda: dst.index_copy_(dim, index.real, source.real))


class FakeTorch:
    """The parts of ``torch`` the ring uses, on :class:`FakeCuda`."""

    def __init__(self, seed: int, eager: float) -> None:
        self.cuda = FakeCuda(seed, eager)
        for name in ("uint8", "int16", "int32", "int64"):
            setattr(self, name, getattr(torch, name))

    def empty(self, n: int, dtype: Any, device: str | None = None, pin_memory: bool = False,
              ) -> FakeTensor:  # fmt: skip
        real = torch.empty(n, dtype=dtype)
        real.view(torch.uint8).fill_(0x5A)  # never zeros: they would hide unwritten bytes
        return FakeTensor(self.cuda, real)

    def zeros(self, n: int, dtype: Any, device: str | None = None, pin_memory: bool = False,
              ) -> FakeTensor:  # fmt: skip
        return FakeTensor(self.cuda, torch.zeros(n, dtype=dtype))

    def index_select(self, src: FakeTensor, dim: int, index: FakeTensor, out: FakeTensor,
                     ) -> None:  # fmt: skip
        def run() -> None:
            torch.index_select(src.real, dim, index.real, out=out.real)

        self.cuda.current.enqueue(run)


def layer_first(slots: np.ndarray, layers: int, fragment: int) -> tuple[np.ndarray, ...]:
    """A restore's ``(host, device, length)``: page ``p`` whole in slot ``slots[p]``, layer
    by layer in the pool, page by page (as :func:`.descriptors.slot_descriptors`)."""
    pages = len(slots)
    p, layer = np.divmod(np.arange(pages * layers, dtype=np.int64), layers)
    host = slots[p] * layers * fragment + layer * fragment
    device = (layer * pages + p) * fragment
    return host, device, np.full(len(host), fragment, dtype=np.int64)


def ring_cases(max_pages: int, **more: Any) -> Callable[[Callable[..., None]], Any]:
    """The Hypothesis cases of batches through the ring: ``pages`` (1 to ``max_pages``) of
    ``layers`` fragments of ``fragment`` bytes, a staging buffer of ``buffer_fragments``
    thirds of a fragment, the fake's ``seed`` and share of work run ``eager``ly, and the
    strategies ``more`` names."""
    cases = given(
        pages=st.integers(1, max_pages),
        layers=st.integers(1, 4),
        fragment=st.sampled_from((8, 24, 512)),
        buffer_fragments=st.integers(1, 30),
        seed=st.integers(0, 2**32 - 1),
        eager=st.sampled_from((0.0, 0.5, 0.9)),
        **more,
    )
    return lambda test: settings(max_examples=40, deadline=None)(cases(test))


@ring_cases(12, count=st.integers(2, 4), ahead=st.booleans())
def test_restores_and_stores_through_the_ring_are_byte_exact_in_any_valid_order(
    pages: int, layers: int, fragment: int, buffer_fragments: int, count: int, seed: int,
    eager: float, ahead: bool,
) -> None:  # fmt: skip
    """Batches restored and stored back to back through one ring (reads ahead of a restore
    adopted where asked), each checked byte for byte once every stream ran."""
    fake = FakeTorch(seed, eager)
    buffer_bytes = max(8, buffer_fragments * fragment // 3)
    ring = StagingRing(fake, 0, buffer_bytes, count)
    main, aux = fake.cuda.Stream(), fake.cuda.Stream()
    rng = np.random.default_rng(seed)
    page_bytes = layers * fragment
    tier = torch.from_numpy(rng.integers(0, 256, 2 * pages * page_bytes, dtype=np.uint8))
    pool = torch.zeros(pages * page_bytes, dtype=torch.uint8)
    host, gpu = FakeTensor(fake.cuda, tier), FakeTensor(fake.cuda, pool)
    for round_ in range(3):
        slots = np.asarray(rng.permutation(2 * pages)[:pages], dtype=np.int64)
        h, g, n = layer_first(slots, layers, fragment)
        plan = plan_staging(h, g, n, buffer_bytes=buffer_bytes, write="device")
        assert plan is not None
        expected = pool.numpy().copy()
        for s, t in zip(h.tolist(), g.tolist(), strict=True):
            expected[t : t + fragment] = tier.numpy()[s : s + fragment]
        ticket = object() if ahead else None
        with fake.cuda.stream(main):
            if ticket is not None:
                unit = row_unit(fragment, buffer_bytes)
                capacity = buffer_bytes // unit * unit
                pieces, fills = page_pieces(slots * page_bytes, page_bytes, capacity)
                ring.read_ahead(ticket, host, pieces, fills, capacity, main)
            ring.restore(plan, host, gpu, main, aux, ticket)
        # A store of the same pages into other slots, enqueued before anything ran.
        back = np.asarray(rng.permutation(2 * pages)[:pages], dtype=np.int64)
        bh, bg, bn = layer_first(back, layers, fragment)
        store = plan_staging(bh, bg, bn, buffer_bytes=buffer_bytes, write="host")
        assert store is not None
        aux.wait_stream(main)  # what the transport does before a store's gathers
        with fake.cuda.stream(main):
            ring.store(store, gpu, host, main, aux)
        main.synchronize()
        aux.synchronize()
        assert np.array_equal(pool.numpy(), expected), f"restore {round_}"
        for s, t in zip(bh.tolist(), bg.tolist(), strict=True):
            assert np.array_equal(tier.numpy()[s : s + fragment], expected[t : t + fragment])
        if ticket is not None:
            assert ring.adopted > 0


def test_an_index_buffer_is_never_rewritten_while_its_upload_or_kernels_may_run() -> None:
    """Pairs whose last use has not run are skipped: a new pair is made (a power of two of
    rows, at least MIN_ROWS); once the stream ran, the first pair is taken again."""
    fake = FakeTorch(0, 0.0)  # nothing runs until asked
    index = IndexBuffers(fake, 0, ring_bytes=0)
    made = len(index.pairs)
    stream = fake.cuda.Stream()
    rows = np.arange(10, dtype=np.int64)
    taken = []
    for _ in range(made + 1):
        pair, _ = index.upload(rows, stream)
        index.release(pair, stream)
        taken.append(pair)
    assert len({id(pair) for pair in taken}) == made + 1  # every busy pair skipped
    assert len(index.pairs) == made + 1
    big, _ = index.upload(np.arange(MIN_ROWS + 1, dtype=np.int64), stream)
    assert big.capacity == 2 * MIN_ROWS
    index.release(big, stream)
    stream.synchronize()
    again, uploaded = index.upload(rows[::-1].copy(), stream)
    assert again is taken[0]
    stream.synchronize()
    assert np.array_equal(uploaded.real.numpy(), rows[::-1])


def restore_descriptors(slots: np.ndarray, pages: np.ndarray, layers: int, fragment: int,
                        pool_pages: int) -> Descriptors:  # fmt: skip
    """Tier slot ``slots[i]`` (whole) into pool page ``pages[i]`` (``layer_first``), page by
    page; a store is the same with the sides swapped."""
    i, layer = np.divmod(np.arange(len(slots) * layers, dtype=np.int64), layers)
    host = slots[i] * layers * fragment + layer * fragment
    device = (layer * pool_pages + pages[i]) * fragment
    length = np.full(len(host), fragment, dtype=np.int64)
    return Descriptors(host, device, length, layer, i, i + 1)


OPS = st.sampled_from(("restore", "store", "direct", "ahead", "ahead, store"))


@ring_cases(8, ops=st.lists(OPS, min_size=1, max_size=7))
def test_batches_of_every_path_keep_the_order_they_were_issued_in(
    pages: int, layers: int, fragment: int, buffer_fragments: int, seed: int, eager: float,
    ops: list[str],
) -> None:  # fmt: skip
    """Staged restores (some adopting a read-ahead), staged stores and restores by one copy
    per fragment, all enqueued before any of them ran, leave the pool and the tier as running
    them one after another would: a store's gathers wait for the writes before them, and
    only for those. A store may come between a read-ahead and its restore (another call's,
    into slots the read does not hold), taking buffers read ahead."""
    fake = FakeTorch(seed, eager)
    options = CudaOptions(staging_buffer_bytes=max(8, buffer_fragments * fragment // 3),
                          staging_buffers=3, gather_min_descriptors=1,
                          staging_min_span_bytes=1, gather_below_bytes=1 << 20)  # fmt: skip
    paths = CopyPaths(fake, options, "never", "auto", lambda name, n: None)
    main = fake.cuda.Stream()
    rng = np.random.default_rng(seed)
    page_bytes = layers * fragment
    tier_np = rng.integers(0, 256, 3 * pages * page_bytes, dtype=np.uint8)  # 3rd: other calls
    pool_np = rng.integers(0, 256, 2 * pages * page_bytes, dtype=np.uint8)
    expected_tier, expected_pool = tier_np.copy(), pool_np.copy()
    tier = {"copy": FakeTensor(fake.cuda, torch.from_numpy(tier_np))}
    pool = {"copy": FakeTensor(fake.cuda, torch.from_numpy(pool_np))}
    staged = 0

    def model(d: Descriptors, source: np.ndarray, target: np.ndarray) -> None:
        for s, t in zip(d.src.tolist(), d.dst.tolist(), strict=True):
            target[t : t + fragment] = source[s : s + fragment]

    for op in ops:
        slots = np.asarray(rng.permutation(2 * pages)[:pages], dtype=np.int64)
        into = np.asarray(rng.permutation(2 * pages)[:pages], dtype=np.int64)
        d = restore_descriptors(slots, into, layers, fragment, 2 * pages)
        with fake.cuda.stream(main):
            if op == "store":
                d = Descriptors(d.dst, d.src, d.length, d.bound, d.page, d.page_end)
                staged += paths.staged(d, pool, tier, 0, None, 0, main) is not None
                model_from, model_to = expected_pool, expected_tier
            elif op == "direct":
                paths.direct(d, tier, pool, 0, main, "copies", True)
                model_from, model_to = expected_tier, expected_pool
            else:
                ticket = object() if op.startswith("ahead") else None
                if ticket is not None:
                    paths.read_ahead(ticket, tier["copy"], slots * page_bytes, page_bytes,
                                     layers, 0, main)  # fmt: skip
                if op == "ahead, store":
                    other = restore_descriptors(2 * pages + np.arange(pages), into, layers,
                                                fragment, 2 * pages)  # fmt: skip
                    back = Descriptors(other.dst, other.src, other.length, other.bound,
                                       other.page, other.page_end)  # fmt: skip
                    staged += paths.staged(back, pool, tier, 0, None, 0, main) is not None
                    model(back, expected_pool, expected_tier)
                staged += paths.staged(d, tier, pool, None, 0, 0, main, ticket) is not None
                model_from, model_to = expected_tier, expected_pool
        model(d, model_from, model_to)
    for stream in fake.cuda.streams:
        stream.synchronize()
    assert staged == sum(
        {"direct": 0, "ahead, store": 2}.get(op, 1) for op in ops
    )  # the ring took every staged batch
    assert np.array_equal(pool_np, expected_pool)
    assert np.array_equal(tier_np, expected_tier)
