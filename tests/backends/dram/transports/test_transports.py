"""Tests of the transports: the interface in base, the cpu transport and the memory transport.

Copies run between plain numpy byte buffers; the expected result is the same descriptors
applied one by one with numpy slicing.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcr_policy.backends import host_copy
from kvcr_policy.backends.dram.transports.base import CopyBatch, Endpoint, Transport, check_bounds
from kvcr_policy.backends.dram.transports.cpu import CpuOptions, CpuTransport
from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.config.schema import PolicyConfig
from kvcr_policy.descriptors import Descriptors
from kvcr_policy.errors import ClosedError, TransportError
from tests.strategies import descriptors


def endpoint(buffer: np.ndarray) -> Endpoint:
    return Endpoint(int(buffer.ctypes.data), buffer.nbytes, "cpu", buffer)


def batch_between(src: np.ndarray, dst: np.ndarray, d: Descriptors) -> CopyBatch:
    return CopyBatch(endpoint(src), endpoint(dst), d)


def applied(src: np.ndarray, dst: np.ndarray, d: Descriptors) -> np.ndarray:
    """What ``dst`` holds after copying ``d`` from ``src``, one descriptor at a time."""
    out = dst.copy()
    for s, t, n in zip(d.src.tolist(), d.dst.tolist(), d.length.tolist(), strict=True):
        out[t : t + n] = src[s : s + n]
    return out


def buffers(d: Descriptors, seed: int = 0, slack: int = 5) -> tuple[np.ndarray, np.ndarray]:
    """Random source and destination bytes just larger than the descriptors reach."""
    rng = np.random.default_rng(seed)
    src_size = int((d.src + d.length).max(initial=0)) + slack
    dst_size = int((d.dst + d.length).max(initial=0)) + slack
    return (
        rng.integers(0, 256, src_size, dtype=np.uint8),
        rng.integers(0, 256, dst_size, dtype=np.uint8),
    )


def cpu(threads: int, min_parallel_bytes: int = 0) -> CpuTransport:
    config = PolicyConfig(transport={"threads": threads})
    return CpuTransport(config, CpuOptions(min_parallel_bytes=min_parallel_bytes))


@pytest.fixture
def transports() -> Iterator[list[Transport]]:
    """Transports made by a test, closed after it."""
    made: list[Transport] = []
    yield made
    for transport in made:
        transport.close()


def nonempty(d: Descriptors) -> Descriptors:
    # check_bounds refuses a descriptor of length 0 (the pipeline never makes one).
    return d.take(d.length > 0)


# ---- the cpu transport --------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
@settings(max_examples=60, deadline=None)
@given(d=descriptors(max_size=40, max_length=64).map(nonempty), seed=st.integers(0, 2**16))
def test_cpu_copies_exactly_what_the_descriptors_say(
    threads: int, d: Descriptors, seed: int
) -> None:
    src, dst = buffers(d, seed)
    expected = applied(src, dst, d)
    transport = cpu(threads)
    try:
        transport.copy(batch_between(src, dst, d))
        assert np.array_equal(dst, expected)
        # And through submit, as the pipeline calls it.
        dst2 = np.zeros_like(dst)
        transport.submit(batch_between(src, dst2, d)).result(timeout=10)
        assert np.array_equal(dst2, applied(src, np.zeros_like(dst), d))
    finally:
        transport.close()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_cpu_splits_few_large_descriptors_between_threads(
    transports: list[Transport], threads: int
) -> None:
    size = 3 << 20
    d = Descriptors.from_arrays([7, size + 100], [0, size + 1], [size, size - 5])
    src, dst = buffers(d, seed=threads)
    expected = applied(src, dst, d)
    transport = cpu(threads)
    transports.append(transport)
    transport.copy(batch_between(src, dst, d))
    assert np.array_equal(dst, expected)


def test_cpu_with_zero_threads_uses_one_per_core(transports: list[Transport]) -> None:
    import os

    transport = cpu(0)
    transports.append(transport)
    assert transport.threads == (os.cpu_count() or 1)
    described = transport.describe()
    assert described["name"] == "cpu"
    assert described["capabilities"] == ["coalesce", "split"]
    assert described["threads"] == transport.threads
    assert described["stream_min_bytes"] is None  # upstream: plain memmove unless configured


# ---- bounds -------------------------------------------------------------------------------


OUT_OF_BOUNDS = {
    "past the source": ([0, 60], [0, 8], [8, 8], "src 60"),
    "past the destination": ([0, 8], [0, 60], [8, 8], "dst 60"),
    "negative source": ([0, -1], [0, 8], [8, 8], "src -1"),
    "negative destination": ([0, 8], [0, -8], [8, 8], "dst -8"),
    "negative length": ([0, 8], [0, 8], [8, -2], "length -2"),
}


@pytest.mark.parametrize("case", list(OUT_OF_BOUNDS))
@pytest.mark.parametrize("make", ["cpu1", "cpu2", "memory"])
def test_out_of_bounds_batches_are_refused_before_any_byte_moves(
    transports: list[Transport], case: str, make: str
) -> None:
    src_off, dst_off, length, fragment = OUT_OF_BOUNDS[case]
    d = Descriptors.from_arrays(src_off, dst_off, length)
    rng = np.random.default_rng(1)
    src = rng.integers(0, 256, 64, dtype=np.uint8)
    dst = rng.integers(0, 256, 64, dtype=np.uint8)
    before = dst.copy()
    transport = {"cpu1": lambda: cpu(1), "cpu2": lambda: cpu(2), "memory": MemoryTransport}[make]()
    transports.append(transport)
    with pytest.raises(TransportError, match=f"descriptor 1 .*{fragment}.*refusing the batch"):
        transport.copy(batch_between(src, dst, d))
    assert np.array_equal(dst, before), "a refused batch wrote bytes"
    with pytest.raises(TransportError):
        transport.submit(batch_between(src, dst, d)).result(timeout=10)
    assert np.array_equal(dst, before)


def test_check_bounds_accepts_descriptors_that_end_exactly_at_the_buffer_end() -> None:
    src, dst = np.zeros(16, np.uint8), np.zeros(16, np.uint8)
    check_bounds(batch_between(src, dst, Descriptors.from_arrays([8], [0], [8])))
    check_bounds(batch_between(src, dst, Descriptors.from_arrays([0], [8], [8])))
    check_bounds(batch_between(src, dst, Descriptors.empty()))
    with pytest.raises(TransportError, match="src 9"):
        check_bounds(batch_between(src, dst, Descriptors.from_arrays([9], [0], [8])))


@pytest.mark.parametrize(
    ("src", "dst", "length"),
    [(1 << 62, 0, 1 << 62), (0, (1 << 63) - 4, 8), (4, 4, (1 << 63) - 1)],
)
def test_check_bounds_refuses_offsets_whose_end_would_wrap_in_int64(
    src: int, dst: int, length: int
) -> None:
    """offset + length past 2**63 wraps negative in int64; the check compares the room left."""
    buffers = np.zeros(16, np.uint8), np.zeros(16, np.uint8)
    with pytest.raises(TransportError, match="falls outside its buffers"):
        check_bounds(batch_between(*buffers, Descriptors.from_arrays([src], [dst], [length])))


# ---- the memory transport and its faults ---------------------------------------------------


def eight_descriptors() -> Descriptors:
    # Eight 4-byte pieces, scattered in both buffers.
    order = np.array([5, 0, 7, 2, 6, 1, 3, 4])
    return Descriptors.from_arrays(order * 4, np.arange(8) * 6, np.full(8, 4))


@pytest.mark.parametrize("cut", [None, 0, 1, 5, 8, 12])
def test_memory_fault_cuts_a_batch_after_k_descriptors(
    transports: list[Transport], cut: int | None
) -> None:
    d = eight_descriptors()
    src, dst = buffers(d, seed=2)
    seen: list[CopyBatch] = []

    def fault(batch: CopyBatch) -> int | None:
        seen.append(batch)
        return cut

    transport = MemoryTransport(fault=fault)
    transports.append(transport)
    batch = batch_between(src, dst, d)
    arrived = 8 if cut is None else min(cut, 8)
    expected = applied(src, dst, d.take(np.arange(arrived)))
    if arrived < 8:
        with pytest.raises(TransportError, match=f"after {arrived} of 8 descriptors"):
            transport.copy(batch)
    else:
        transport.copy(batch)
    assert np.array_equal(dst, expected)
    assert seen == [batch]
    assert transport.batches == 1


def test_memory_fault_that_raises_copies_nothing(transports: list[Transport]) -> None:
    d = eight_descriptors()
    src, dst = buffers(d, seed=3)
    before = dst.copy()

    def fault(batch: CopyBatch) -> int | None:
        raise ConnectionResetError("peer went away")

    transport = MemoryTransport(fault=fault)
    transports.append(transport)
    with pytest.raises(ConnectionResetError):
        transport.copy(batch_between(src, dst, d))
    with pytest.raises(ConnectionResetError):
        transport.submit(batch_between(src, dst, d)).result(timeout=10)
    assert np.array_equal(dst, before)


def test_memory_fault_is_not_consulted_for_an_out_of_bounds_batch(
    transports: list[Transport],
) -> None:
    calls: list[CopyBatch] = []
    transport = MemoryTransport(fault=lambda batch: calls.append(batch))  # type: ignore[func-returns-value]
    transports.append(transport)
    src, dst = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    with pytest.raises(TransportError):
        transport.copy(batch_between(src, dst, Descriptors.from_arrays([4], [0], [8])))
    assert calls == []


# ---- lifetime -----------------------------------------------------------------------------


@pytest.mark.parametrize("make", ["cpu2", "memory"])
def test_close_waits_for_submitted_batches_then_refuses_more(make: str) -> None:
    d = eight_descriptors()
    src, dst = buffers(d, seed=4)
    expected = applied(src, dst, d)
    gate, entered = threading.Event(), threading.Event()

    class Slow(MemoryTransport if make == "memory" else CpuTransport):  # type: ignore[misc]
        def copy(self, batch: CopyBatch) -> None:
            entered.set()
            assert gate.wait(10)
            super().copy(batch)

    transport = (
        Slow() if make == "memory" else Slow(PolicyConfig(transport={"threads": 2}), CpuOptions())
    )
    future = transport.submit(batch_between(src, dst, d))
    assert entered.wait(10)
    closer = threading.Thread(target=transport.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive(), "close returned while a batch was still copying"
    gate.set()
    closer.join(10)
    assert not closer.is_alive()
    assert future.done() and future.exception() is None
    assert np.array_equal(dst, expected)
    with pytest.raises(ClosedError, match="closed"):
        transport.submit(batch_between(src, dst, d))
    transport.close()  # idempotent


def test_the_base_transport_has_no_copy_of_its_own() -> None:
    transport = Transport()
    src, dst = np.zeros(8, np.uint8), np.zeros(8, np.uint8)
    with pytest.raises(NotImplementedError):
        transport.copy(batch_between(src, dst, Descriptors.empty()))
    assert transport.backend == "dram"
    assert transport.describe() == {"name": "base", "capabilities": []}
    transport.close()
    transport.close()


# ---- non-temporal stores (docs/engine.md: "With transport.stream_min_bytes set, large copies use
# non-temporal stores") ----------------------------------------------------------------------


@pytest.mark.skipif(not host_copy.STREAM, reason="no native loop with non-temporal stores here")
@pytest.mark.parametrize(("profile", "stream"), [("default", 0), ("throughput", 16 << 10)])
def test_stream_min_bytes_sends_large_copies_down_the_non_temporal_path(
    monkeypatch: pytest.MonkeyPatch, profile: str, stream: int
) -> None:
    """Through a pipeline: every native copy call carries the profile's threshold, so the copies
    of at least ``stream_min_bytes`` are streamed (the native loop's rule, whose bytes
    test_copy.py checks), and the default profile streams nothing."""
    from kvcr_policy import build_pipeline, load_config
    from kvcr_policy.geometry import PoolGeometry

    calls: list[tuple[int, list[int]]] = []
    native = host_copy._copy.copy_many

    def recording(dst: int, src: int, dsts: object, srcs: object, lengths: object, s: int) -> None:
        calls.append((s, np.asarray(lengths).tolist()))
        native(dst, src, dsts, srcs, lengths, s)

    monkeypatch.setattr(host_copy._copy, "copy_many", recording)
    # page_first pages of 512 KiB: 8 consecutive pages coalesce into runs of 2 x 2 MiB.
    geo = PoolGeometry(
        name="kv", layout="page_first", layers=4, heads=8, head_dim=128, dtype="float16",
        page_size=32, tokens=32 * 16,
    )  # fmt: skip
    pool = np.random.default_rng(3).integers(0, 1 << 16, geo.shape, dtype=np.uint16)
    view = pool.view(np.float16)
    loaded = load_config(profile, environ={}, overrides={"placement.capacity_bytes": "8MiB"})
    assert loaded.config.transport.stream_min_bytes == (stream or None)
    with build_pipeline(loaded) as pipeline:
        pipeline.register_pool("kv", geo, view)
        keys = [f"p{i}" for i in range(8)]
        assert pipeline.set(keys, np.arange(8 * 32)) == [True] * 8
        assert pipeline.get(keys, np.arange(8 * 32, 16 * 32)) == [True] * 8
        assert pipeline.stats().transport["stream_min_bytes"] == (stream or None)
    assert np.array_equal(pool[:, 256:], pool[:, :256])
    assert calls and {s for s, _ in calls} == {stream}
    if stream:
        assert any(n >= stream for _, lengths in calls for n in lengths)
