"""Tests for the cuda transport, its gather planning and its refusal without a GPU.

Planning, options and the "no CUDA device visible" refusal run everywhere. Tests marked
``cuda`` need a GPU and skip without one (CI has none); on a GPU machine run
``python -m pytest tests/backends/dram/transports/test_cuda.py -rs``. Byte checks of those
tests compare on the GPU.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from kvcr_policy.backends.dram.transports.base import CopyBatch, Endpoint
from kvcr_policy.backends.dram.transports.cuda import (
    NO_CUDA,
    CudaOptions,
    CudaTransport,
    CudaUnavailableError,
    require_cuda,
)
from kvcr_policy.backends.dram.transports.cuda_gather import choose_kernel, plan_rows
from kvcr_policy.backends.dram.transports.cuda_options import resolved_modes
from kvcr_policy.config.loading import load_config
from kvcr_policy.descriptors import Descriptors
from kvcr_policy.errors import ClosedError, PoolError, TransportError
from kvcr_policy.geometry import PoolGeometry
from kvcr_policy.pipeline import Pipeline, build_pipeline
from kvcr_policy.plugins import make_plugin_manager
from kvcr_policy.strategies import follow_coalescing
from tests.strategies import descriptors
from tests.support import pools
from tests.support.pools import keys_of, token_indices

torch = pytest.importorskip("torch")

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(
    not HAS_CUDA,
    reason=(
        f"{NO_CUDA} (CI has no GPU); on a GPU machine: "
        "python -m pytest tests/backends/dram/transports/test_cuda.py"
    ),
)


# ---- everywhere: options, registration, planning, the refusal without CUDA ----------------


def test_options_model_needs_no_cuda() -> None:
    options = CudaOptions()
    assert options.gather == "with_coalescing"
    assert CudaOptions(gather="never", gather_chunk_bytes="64MiB").gather_chunk_bytes == 64 << 20
    with pytest.raises(ValidationError, match="gather"):
        CudaOptions(gather="sometimes")
    with pytest.raises(ValidationError, match="extra"):
        CudaOptions(stream_count=2)  # type: ignore[call-arg]


@pytest.mark.parametrize("coalescing", ["none", "contiguous"])
def test_with_coalescing_defaults_follow_the_coalescing_control(coalescing: str) -> None:
    """The defaults resolve by the core's one rule: upstream's modes under the default
    profile's ``none``, ``auto`` (and whole tier slots) under a strategy that coalesces."""
    follows = "never" if coalescing == "none" else "auto"
    assert follow_coalescing("with_coalescing", coalescing) == follows
    assert follow_coalescing("always", coalescing) == "always"
    assert resolved_modes(CudaOptions(), coalescing) == (follows, follows, follows == "auto")
    explicit = CudaOptions(gather="never", staging="always", tier_slots="mirror")
    assert resolved_modes(explicit, coalescing) == ("never", "always", False)


def test_cuda_is_a_registered_transport_with_its_options() -> None:
    spec = make_plugin_manager().registry.get("transport", "cuda")
    assert spec.options is CudaOptions
    assert spec.plugin == "builtin.dram"  # the dram backend registers its transports


def byte_map(d: Descriptors) -> tuple[np.ndarray, np.ndarray]:
    owner = np.repeat(np.arange(len(d)), d.length)
    within = np.arange(owner.size) - np.repeat(np.cumsum(d.length) - d.length, d.length)
    return d.src[owner] + within, d.dst[owner] + within


@given(descriptors(), st.integers(1, 64), st.sampled_from([0, 8, 4096, 3]))
def test_rows_cover_every_byte_once_in_order(d: Descriptors, scale: int, base: int) -> None:
    d = Descriptors.from_arrays(d.src * scale, d.dst * scale, d.length * scale)
    plan = plan_rows(d, src_base=base, dst_base=4096, max_unit=64)
    if d.nbytes == 0:
        assert plan is None
        return
    assert plan is not None
    assert all(int(x) % plan.unit == 0 for x in (*d.src, *d.dst, *d.length))
    assert plan.unit % plan.itemsize == 0 and (base | 4096) % plan.itemsize == 0
    assert plan.unit <= 64 or plan.unit % 2
    rows = np.arange(plan.unit)
    src = (plan.src_rows[:, None] * plan.unit + rows).reshape(-1)
    dst = (plan.dst_rows[:, None] * plan.unit + rows).reshape(-1)
    expected_src, expected_dst = byte_map(d)
    assert np.array_equal(src, expected_src)
    assert np.array_equal(dst, expected_dst)
    assert plan.nbytes == d.nbytes


def test_kernel_choice_follows_the_contiguous_side() -> None:
    rng = np.random.default_rng(1)
    scattered = rng.permutation(256) * 4096
    consecutive = np.arange(256) * 4096
    lengths = np.full(256, 4096)

    def kind(src: np.ndarray, dst: np.ndarray) -> str:
        plan = plan_rows(Descriptors.from_arrays(src, dst, lengths), src_base=0, dst_base=0)
        assert plan is not None
        return choose_kernel(plan)

    assert kind(scattered, consecutive) == "dst_runs"  # restore from scattered slots
    assert kind(consecutive, scattered) == "src_runs"  # offload into scattered slots
    assert kind(scattered, rng.permutation(256) * 4096) == "scratch"


def test_without_cuda_the_transport_refuses_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CudaUnavailableError, match=NO_CUDA):
        require_cuda()
    loaded = load_config(environ={}, overrides={"transport.name": "cuda"})
    with pytest.raises(CudaUnavailableError, match=r"use transport\.name = 'cpu'"):
        build_pipeline(loaded)


# ---- on a GPU ----------------------------------------------------------------------------

PAGE = 16


#: The GPU pools: 4 layers, head dim 64, bfloat16, 16 tokens per page, on the first GPU.
geometry = partial(
    pools.geometry, layers=4, head_dim=64, dtype="bfloat16", page_size=PAGE, device="cuda:0"
)


def pipeline(
    geo: PoolGeometry,
    *,
    coalescing: str = "contiguous",
    gather: str = "auto",
    staging: Any = "never",
    **more: Any,
) -> Pipeline:
    """``staging``: a mode, or a dict of staging options (the tests of other paths keep it off)."""
    options = staging if isinstance(staging, dict) else {"staging": staging}
    overrides = {
        "transport": {"name": "cuda", "options": {"gather": gather, **options}},
        "coalescing.strategy": coalescing,
        "placement.capacity_bytes": geo.nbytes,
        "batching.read_batch_pages": 8,
        **more,
    }
    return build_pipeline(load_config(environ={}, overrides=overrides))


def ring_of(mode: str, buffer_bytes: int, page: int) -> dict[str, Any]:
    """Staging options for a ring of 3 buffers of ``buffer_bytes`` over a whole-slot tier,
    staging any batch whose host runs average a ``page``."""
    return {
        "staging": mode,
        "staging_buffers": 3,
        "staging_buffer_bytes": buffer_bytes,
        "staging_min_span_bytes": page,
        "gather_min_descriptors": 1,
        "tier_slots": "whole",
    }


def random_pool(geo: PoolGeometry) -> Any:
    pool = torch.empty(geo.shape, dtype=torch.bfloat16, device=geo.device)
    pool.view(-1).view(torch.int16).random_(-(2**15), 2**15)
    return pool


def same(a: Any, b: Any) -> bool:
    """Bitwise equality on the GPU (random bf16 bits include NaNs, which never compare equal)."""
    return bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


@pytest.fixture
def rng() -> Iterator[np.random.Generator]:
    yield np.random.default_rng(7)


@pytest.mark.parametrize("gather", ["with_coalescing", "auto", "never", "always"])
@pytest.mark.parametrize("coalescing", ["contiguous", "none"])
@pytest.mark.parametrize(
    ("layout", "mla"), [("layer_first", False), ("page_first", False), ("layer_first", True)]
)
@pytest.mark.parametrize("scatter", [False, True])
@pytest.mark.cuda
@needs_cuda
def test_offload_then_restore_is_byte_exact_on_the_gpu(
    layout: str, mla: bool, coalescing: str, gather: str, scatter: bool, rng: np.random.Generator
) -> None:
    geo = geometry(layout, mla=mla)
    pool = random_pool(geo)
    original = pool.clone()
    n = geo.pages
    order = rng.permutation(n) if scatter else np.arange(n)
    with pipeline(geo, coalescing=coalescing, gather=gather) as p:
        p.register_pool("kv", geo, pool)
        torch.cuda.synchronize()
        assert all(p.set([keys_of("k", n)[i] for i in order], token_indices(order, PAGE)))
        pool.view(-1).view(torch.uint8).fill_(0xA5)
        torch.cuda.synchronize()
        assert p.get(keys_of("k", n), token_indices(np.arange(n), PAGE)) == [True] * n
        assert same(pool, original)
        paths = p.stats().transport["paths"]
    if gather == "never" or (gather == "with_coalescing" and coalescing == "none"):
        # Upstream behaviour: one copy per descriptor, whatever the batch looks like.
        assert all(name.startswith("copies") for name in paths)
    if gather == "always":
        assert all(name.startswith("gather") for name in paths)


@pytest.mark.cuda
@needs_cuda
def test_scattered_restore_takes_the_gather_path_and_reports_it(rng: np.random.Generator) -> None:
    geo = geometry(pages=64)
    pool = random_pool(geo)
    original = pool.clone()
    half = np.arange(32)
    with pipeline(geo, **{"batching.read_batch_pages": 32}) as p:
        p.register_pool("kv", geo, pool)
        torch.cuda.synchronize()
        order = rng.permutation(32)
        assert all(p.set([keys_of("k", 32)[i] for i in order], token_indices(order, PAGE)))
        assert (
            p.get(keys_of("k", 32), token_indices(32 + half, PAGE)) == [True] * 32
        )  # into other pages
        torch.cuda.synchronize()
        assert same(pool[:, :, 32 * PAGE :], original[:, :, : 32 * PAGE])
        described = p.stats().transport
    # Offload into consecutive slots and restore into consecutive pages: both write runs.
    assert described["paths"]["gather:dst_runs.batches"] == 2
    (registration,) = described["registrations"]
    assert registration["bytes"] == geo.nbytes and registration["seconds"] > 0


@pytest.mark.parametrize("mode", ["always", "auto", "never"])
@pytest.mark.parametrize(("layout", "mla"), [("layer_first", False), ("layer_first", True),
                                             ("page_first", False)])  # fmt: skip
@pytest.mark.cuda
@needs_cuda
def test_staged_offload_and_restore_of_scattered_slots_are_byte_exact(
    layout: str, mla: bool, mode: str, rng: np.random.Generator
) -> None:
    """Slots scattered by storing in a random order, each slot whole on the host; a ring of 3
    buffers of a page and a half each, so fills cut host runs, wrap the ring many times and
    span batches. 'never' moves the same whole-slot tier with one copy per fragment."""
    geo = geometry(layout, mla=mla, pages=64)
    page = geo.nbytes // geo.pages
    staging = ring_of(mode, page * 3 // 2, page)
    pool = random_pool(geo)
    original = pool.clone()
    n = geo.pages
    order = rng.permutation(n)
    with pipeline(geo, staging=staging) as p:
        p.register_pool("kv", geo, pool)
        torch.cuda.synchronize()
        assert all(p.set([keys_of("k", n)[i] for i in order], token_indices(order, PAGE)))
        pool.view(-1).view(torch.uint8).fill_(0xA5)
        torch.cuda.synchronize()
        assert p.get(keys_of("k", n), token_indices(np.arange(n), PAGE)) == [True] * n
        torch.cuda.synchronize()
        assert same(pool, original)
        described = p.stats().transport
    paths = described["paths"]
    if mode != "never":
        assert paths.get("staging:store.batches", 0) > 0
        assert paths.get("staging:restore.batches", 0) > 0
    assert described["staging"] == mode and described["tier_slots"] == "whole"
    # The ring is taken when the tier registers (not in the first timed copy), only if staging
    assert described["staging_device_bytes"] == (
        {"cuda:0": 3 * (page * 3 // 2)} if mode != "never" else {}
    )
    # ... and warmed then too: its kernels loaded before the first copy of a pool.
    warmed = described["staging_warm_s"]
    assert set(warmed) == ({"cuda:0"} if mode != "never" else set())
    assert all(seconds > 0 for seconds in warmed.values())


@pytest.mark.cuda
@needs_cuda
def test_windows_bound_batches_in_flight() -> None:
    geo = geometry(pages=64)
    pool = random_pool(geo)
    original = pool.clone()
    n = geo.pages
    with pipeline(geo, **{"batching.read_batch_pages": 4, "batching.window_batches": 2}) as p:
        p.register_pool("kv", geo, pool)
        torch.cuda.synchronize()
        assert all(p.set(keys_of("k", n), token_indices(np.arange(n), PAGE)))
        pool.zero_()
        torch.cuda.synchronize()
        ready: list[int] = []
        assert all(p.get(keys_of("k", n), token_indices(np.arange(n), PAGE), on_ready=ready.append))
        stats = p.stats()
    assert same(pool, original)
    assert stats.peak_inflight_batches <= 2
    assert ready == sorted(ready) and ready[-1] == n


@pytest.mark.cuda
@needs_cuda
def test_close_waits_unregisters_and_refuses_later_calls() -> None:
    geo = geometry()
    pool = random_pool(geo)
    p = pipeline(geo)
    p.register_pool("kv", geo, pool)
    region = p._pool("kv")[1].region  # the dram backend's pool tier
    transport = p.transport
    p.set(keys_of("k", geo.pages), token_indices(np.arange(geo.pages), PAGE))
    p.close()
    p.close()  # idempotent
    assert region.state == "closed" and not region.leaked
    assert transport._regions == {}  # type: ignore[attr-defined]
    batch = CopyBatch(Endpoint(0, 1, "cuda:0"), Endpoint(0, 1, "cuda:0"), Descriptors.empty())
    with pytest.raises(ClosedError):
        transport.submit(batch)
    with pytest.raises(ClosedError):
        p.get(keys_of("k", 1), token_indices(np.arange(1), PAGE))


@pytest.mark.cuda
@needs_cuda
def test_refusals_name_the_problem() -> None:
    geo = geometry()
    with pipeline(geo) as p:
        cpu_geo = replace(geo, device="cpu")
        with pytest.raises(PoolError, match="moves only cuda"):
            p.register_pool("kv", cpu_geo, torch.zeros(cpu_geo.shape, dtype=torch.bfloat16))
        pool = random_pool(geo)
        p.register_pool("kv", geo, pool)
        endpoint = p._pool("kv")[1].pool_side.endpoint
        beyond = Descriptors.from_arrays([0], [geo.nbytes], [1])
        with pytest.raises(TransportError, match="outside its buffers"):
            p.transport.submit(CopyBatch(endpoint, endpoint, beyond))
        stray = np.zeros(64, dtype=np.uint8)
        unregistered = Endpoint(int(stray.ctypes.data), 64, "cpu", stray)
        with pytest.raises(TransportError, match="not a tier region registered"):
            p.transport.copy(
                CopyBatch(unregistered, endpoint, Descriptors.from_arrays([0], [0], [64]))
            )


@pytest.mark.cuda
@needs_cuda
def test_stats_report_pinned_bytes_and_where_the_gpu_sits() -> None:
    geo = geometry()
    with pipeline(geo, **{"placement.numa_policy": "gpu", "placement.prefault": True}) as p:
        p.register_pool("kv", geo, random_pool(geo))
        stats = p.stats()
        audit = p.audit()["kv"]
    pool = stats.pools["kv"]
    assert pool["pinned_bytes"] == pool["tier_bytes"] == geo.nbytes
    assert pool["registration_s"] > 0
    assert stats.memory == {"tier_bytes": geo.nbytes, "pinned_bytes": geo.nbytes,
                            "registration_s": pool["registration_s"]}  # fmt: skip
    gpu = pool["device"]
    assert gpu["device"] == "cuda:0" and gpu["pci_address"]  # torch reports the PCI address
    # Near its GPU's node, or (a GPU reporting no node, as on single-node hosts and VMs)
    # left unbound, and said so: either way the audit says which.
    if gpu["numa_node"] is None:
        assert audit["numa_near"].endswith("tier left unbound")
        assert audit["numa_policy_requested"] == "none"
    else:
        assert audit["numa_nodes_requested"] == [gpu["numa_node"]]
        assert audit["pages_per_node"] == {str(gpu["numa_node"]): audit["numa_sampled_pages"]}


@pytest.mark.cuda
@needs_cuda
def test_staged_batches_keep_the_order_of_one_copy_at_a_time(rng: np.random.Generator) -> None:
    """Batches submitted back to back, none waited for, each writing pool bytes the one before
    wrote: staged (planned in chunks, the stream idle), then a few copies, then a staged batch
    whose first chunk writes one range twice (that chunk takes copies). The pool ends as one
    copy per descriptor, in order, leaves it."""
    options = {
        "staging": "auto",
        "gather": "never",
        "staging_buffer_bytes": 4096,
        "staging_buffers": 2,
        "staging_min_span_bytes": 1024,
    }
    loaded = load_config(environ={}, overrides={"transport": {"name": "cuda", "options": options}})
    transport = CudaTransport(loaded.config, CudaOptions(**options))
    fragment, count = 512, 64
    host_map = mmap.mmap(-1, 1 << 16)
    host = np.frombuffer(host_map, dtype=np.uint8)
    host[:] = rng.integers(0, 256, host.size, dtype=np.uint8)
    pool = torch.zeros(1 << 16, dtype=torch.uint8, device="cuda:0")
    host_end = Endpoint(int(host.ctypes.data), host.nbytes, "cpu", host)
    pool_end = Endpoint(pool.data_ptr(), pool.numel(), "cuda:0", pool)
    expected = np.zeros(1 << 16, dtype=np.uint8)

    def batch(src: np.ndarray, dst: np.ndarray) -> CopyBatch:
        n = len(src)
        length = np.full(n, fragment, dtype=np.int64)
        page = np.arange(n, dtype=np.int64)
        d = Descriptors(src, dst, length, np.zeros(n, dtype=np.int64), page, page + 1)
        for s, t in zip(src.tolist(), dst.tolist(), strict=True):
            expected[t : t + fragment] = host[s : s + fragment]
        return CopyBatch(host_end, pool_end, d)

    slots = np.arange(count, dtype=np.int64) * fragment  # host runs: the whole batch
    scattered = rng.permutation(count).astype(np.int64) * fragment
    twice = scattered.copy()
    twice[3] = twice[1]  # one range written twice inside the first chunk
    batches = [
        batch(slots, scattered),
        batch(slots[:4] + 40 * fragment, scattered[:4]),  # too few to stage: copies
        batch(slots + 64 * fragment, twice),
    ]
    try:
        transport.attach_region(host_end, pool_end)
        futures = [transport.submit(b) for b in batches]
        for future in futures:
            future.result(timeout=60)
        paths = transport.describe()["paths"]
        assert np.array_equal(pool.cpu().numpy(), expected)
        assert paths["staging:restore.batches"] + paths["copies.batches"] == len(batches)
        assert paths["staging:restore.chunks"] >= 3  # the first batch: planned in chunks
    finally:
        transport.close()
        transport.detach_region(host_end)


@pytest.mark.parametrize("mla", [False, True])
@pytest.mark.parametrize("scatter", [False, True])
@pytest.mark.cuda
@needs_cuda
def test_a_read_ahead_is_adopted_where_it_fits_and_restores_are_byte_exact(
    mla: bool, scatter: bool, rng: np.random.Generator
) -> None:
    """A read starts filling the ring from its claimed slots before its first batch is
    planned; with slots stored in order the first batch adopts those fills, scattered ones
    read nothing ahead (or discard it); the pool ends byte for byte as stored either way."""
    geo = geometry("layer_first", mla=mla, pages=64)
    page = geo.nbytes // geo.pages
    staging = ring_of("auto", page * 2, page)
    pool = random_pool(geo)
    original = pool.clone()
    n = geo.pages
    order = rng.permutation(n) if scatter else np.arange(n)
    with pipeline(geo, staging=staging, **{"batching.read_batch_pages": 16}) as p:
        p.register_pool("kv", geo, pool)
        torch.cuda.synchronize()
        assert all(p.set([keys_of("k", n)[i] for i in order], token_indices(order, PAGE)))
        for _ in range(2):  # the second read finds the ring's buffers used by the first
            pool.view(-1).view(torch.uint8).fill_(0xA5)
            torch.cuda.synchronize()
            assert p.get(keys_of("k", n), token_indices(np.arange(n), PAGE)) == [True] * n
            torch.cuda.synchronize()
            assert same(pool, original)
        paths = p.stats().transport["paths"]
    if not scatter:
        assert paths["staging:read_ahead.fills"] == 2 * 3
        assert paths["staging:read_ahead.adopted"] == 2 * 3


@pytest.mark.parametrize("mla", [False, True])
@pytest.mark.cuda
@needs_cuda
def test_a_read_ahead_of_a_slot_rewritten_before_the_claim_restores_the_new_bytes(
    mla: bool,
) -> None:
    """A get starts reading ahead before its claim (:class:`PoolReadsEarly`); a writer
    rewrites the first key between the two (delete, reserve, new host bytes, commit), after
    the early fills copied the old bytes: the claim finds that slot rewritten, the early fills
    are never adopted, and every page restored is the one stored last, byte for byte."""
    geo = geometry("layer_first", mla=mla, pages=64)
    page_bytes = geo.page_bytes
    pool = random_pool(geo)
    original = pool.clone()
    axis = 1 if mla else 2  # the token axis of layer_first

    def pages(t: Any, start: int, count: int) -> Any:
        return t.narrow(axis, start * PAGE, count * PAGE)

    n = 32
    keys = keys_of("k", n)
    staging = ring_of("auto", page_bytes * 2, page_bytes)
    with pipeline(geo, staging=staging, **{"batching.read_batch_pages": 16}) as p:
        p.register_pool("kv", geo, pool)
        torch.cuda.synchronize()
        assert all(p.set(keys, token_indices(np.arange(n), PAGE)))
        tier = p.backend._pools[0]
        store, base = tier.store, tier.tier_side.endpoint.address
        early = tier.read_early
        started: list[Any] = []

        def rewrite_first(asked: list[str]) -> Any:
            read = early(asked)
            started.append(read)
            torch.cuda.synchronize()  # the early fills hold the old bytes
            last = int(store.lookup(keys[-1:])[0])
            assert store.delete(keys[:1]) == 1
            reservation = store.reserve(keys[:1])
            slot = int(reservation.slots[0])
            ctypes.memmove(base + slot * page_bytes, base + last * page_bytes, page_bytes)
            store.commit(reservation, [True])
            return read

        tier.read_early = rewrite_first
        pages(pool, n, n).fill_(1.0)
        torch.cuda.synchronize()
        assert p.get(keys, token_indices(np.arange(n, 2 * n), PAGE)) == [True] * n
        torch.cuda.synchronize()
        assert started[0] is not None  # the early fills were copying
        assert same(pages(pool, n, 1), pages(original, n - 1, 1))  # the new first page
        assert same(pages(pool, n + 1, n - 1), pages(original, 1, n - 1))
        paths = p.stats().transport["paths"]
    assert paths["staging:read_ahead.fills"] >= 3  # the ring's three, read early
    assert paths["staging:read_ahead.adopted"] <= paths["staging:read_ahead.fills"] - 3


@pytest.mark.cuda
@needs_cuda
def test_fills_read_ahead_are_adopted_only_by_their_ticket_and_only_while_kept(
    rng: np.random.Generator,
) -> None:
    """Straight on the transport: a restore batch adopts the fills read ahead for its ticket;
    not after the ticket is forgotten (the host bytes changed since: the new ones arrive),
    not with another ticket, and not once a store took one of those buffers."""
    options = {"staging": "auto", "gather": "never", "staging_buffer_bytes": 8192,
               "staging_buffers": 2, "staging_min_span_bytes": 1024,
               "gather_min_descriptors": 1}  # fmt: skip
    loaded = load_config(environ={}, overrides={"transport": {"name": "cuda", "options": options}})
    transport = CudaTransport(loaded.config, CudaOptions(**options))
    fragment, fragments, pages = 512, 8, 8  # pages of 4 KiB: a buffer holds two
    page_bytes = fragment * fragments
    host_map = mmap.mmap(-1, 1 << 16)
    host = np.frombuffer(host_map, dtype=np.uint8)
    pool = torch.zeros(1 << 16, dtype=torch.uint8, device="cuda:0")
    host_end = Endpoint(int(host.ctypes.data), host.nbytes, "cpu", host)
    pool_end = Endpoint(pool.data_ptr(), pool.numel(), "cuda:0", pool)
    # Page p, fragment f: host slot p (whole), pool plane f (layer_first).
    p, f = np.divmod(np.arange(pages * fragments, dtype=np.int64), fragments)
    length = np.full(len(p), fragment, dtype=np.int64)
    d = Descriptors(p * page_bytes + f * fragment, (f * pages + p) * fragment, length,
                    f, p, p + 1)  # fmt: skip
    starts = np.arange(pages, dtype=np.int64) * page_bytes

    def restore(ticket: object) -> np.ndarray:
        pool.fill_(0)
        transport.submit(CopyBatch(host_end, pool_end, d, ticket)).result(timeout=60)
        expected = np.zeros(pool.numel(), dtype=np.uint8)
        for s, t in zip(d.src.tolist(), d.dst.tolist(), strict=True):
            expected[t : t + fragment] = host[s : s + fragment]
        assert np.array_equal(pool.cpu().numpy(), expected)
        return expected

    def adopted() -> int:
        return int(transport.describe()["paths"].get("staging:read_ahead.adopted", 0))

    try:
        transport.attach_region(host_end, pool_end)
        host[:] = rng.integers(0, 256, host.size, dtype=np.uint8)
        ticket = transport.read_ahead(host_end, pool_end, starts, page_bytes, fragments)
        assert ticket is not None
        restore(ticket)
        assert adopted() == 2  # both buffers of the ring
        # Forgotten, then the host changes (its claim ended, a writer came): not adopted.
        ticket = transport.read_ahead(host_end, pool_end, starts, page_bytes, fragments)
        torch.cuda.synchronize()
        transport.forget(ticket)
        host[:] = rng.integers(0, 256, host.size, dtype=np.uint8)
        restore(ticket)
        # Another read's ticket: not adopted.
        transport.read_ahead(host_end, pool_end, starts, page_bytes, fragments)
        restore(object())
        # A store takes a buffer read ahead: nothing of it is adopted after.
        ticket = transport.read_ahead(host_end, pool_end, starts, page_bytes, fragments)
        back = CopyBatch(pool_end, host_end, Descriptors(d.dst, d.src + (1 << 15), length,
                                                         f, p, p + 1))  # fmt: skip
        transport.submit(back).result(timeout=60)
        restore(ticket)
        assert adopted() == 2
        # Scattered slots: read ahead too, and adopted by a batch of those pages in that order.
        host[:] = rng.integers(0, 256, host.size, dtype=np.uint8)
        reverse = np.arange(pages * fragments, dtype=np.int64)
        p, f = np.divmod(reverse, fragments)
        p = pages - 1 - p  # the pages in reverse order, each whole, fragment by fragment
        d = Descriptors(p * page_bytes + f * fragment, (f * pages + p) * fragment, length,
                        f, p, p + 1)  # fmt: skip
        ticket = transport.read_ahead(host_end, pool_end, starts[::-1].copy(), page_bytes,
                                      fragments)  # fmt: skip
        assert ticket is not None
        restore(ticket)
        assert adopted() == 4
    finally:
        transport.close()
        transport.detach_region(host_end)
