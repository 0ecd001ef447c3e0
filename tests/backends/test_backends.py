"""The pipeline's behaviour on every tier backend: the built-in ``dram`` and ``peer``, the
example plugin's third-party ``dict`` backend (selected by a TOML profile), the ``kvcr``
plugin's KVCR runner (selected by the environment) and the ``mooncake`` plugin's Mooncake Store.

The same tests run on all of them: byte-exact store and restore, leading-run semantics, claims
that keep a page being read from eviction, fallback page by page, delivery windows, lifetime.
The peer runs as a real ``kvcr-policy serve`` process over ucxx on loopback; ``kvcr`` runs the
real KVCR 0.1.1 over NIXL, in this process, next to ucxx; Mooncake as a real
``mooncake_master`` on free loopback ports, stopped by PID.
"""

from __future__ import annotations

import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.backends.dram.transports.base import CopyBatch
from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.errors import ArgumentError, CapacityError, ClosedError, PoolError, UsageError
from kvcr_policy.pipeline import Pipeline
from tests.conftest import EXAMPLE_MISSING, example_installed, kvcr_missing
from tests.plugins.mooncake.mooncake_helpers import need_mooncake
from tests.support.installs import missing
from tests.support.pools import P, fresh_keys, geometry, pages_of, pool_buffer, token_indices
from tests.support.waiting import wait_until

BACKENDS = ["dram", "peer", "dict", "kvcr", "mooncake"]
SLOTS = 16  # tier capacity in pages, on every backend
PAGE_BYTES = geometry().page_bytes


@pytest.fixture(scope="module")
def small_peer() -> Iterator[Any]:
    """A `kvcr-policy serve` whose tier holds SLOTS pages per pool (module-wide)."""
    try:
        import ucxx  # noqa: F401
    except Exception as err:
        pytest.skip(f"ucxx cannot be imported ({err}); pip install 'kvcr-policy[ucx]'")
    from kvcr_policy.backends.peer.process import PeerProcess
    from kvcr_policy.backends.peer.server.tiers import tier_bytes

    server = PeerProcess(
        {
            "transport.name": "ucx",
            "transport.op_timeout_s": 10,
            "placement.capacity_bytes": tier_bytes(SLOTS, PAGE_BYTES),
            "transport.options.heartbeat_s": 0.5,
            "transport.options.max_tiers": 128,  # a pool name of its own per test
        }
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def small_master() -> Iterator[Any]:
    """A ``mooncake_master`` on free loopback ports (module-wide), stopped by PID."""
    need_mooncake()
    from kvcr_policy_mooncake.master import MasterProcess

    with MasterProcess() as master:
        yield master


Make = Callable[..., Pipeline]


@pytest.fixture(params=BACKENDS)
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    """``make(profile, overrides, transport=None)``: a pipeline on the parametrized backend,
    closed after the test; its tier holds SLOTS pages of :func:`geometry`."""
    name = request.param
    opened: list[Pipeline] = []
    base: dict[str, Any] = {"placement.capacity_bytes": SLOTS * PAGE_BYTES}
    selector: Path | None = None
    environ: dict[str, str] = {}
    if name == "peer":
        server = request.getfixturevalue("small_peer")
        base = {
            "transport.name": "ucx",
            "transport.options.peer": server.address,
            "transport.options.heartbeat_s": 0.5,
            "transport.op_timeout_s": 10,
        }
    elif name == "mooncake":
        master = request.getfixturevalue("small_master")
        # Mooncake's smallest segment (16 MiB) holds far more than SLOTS pages: the tier
        # holds them all, and Mooncake's leases, not slot claims, guard pages being read.
        base = {
            "backend.name": "mooncake",
            "backend.options.master": master.address,
            "backend.options.segment_bytes": "16MiB",
        }
    elif name == "dict":
        if not example_installed():
            pytest.skip(EXAMPLE_MISSING)
        # A third-party backend chosen by a TOML profile, exactly as a deployment would.
        selector = tmp_path / "dict.toml"
        selector.write_text(
            textwrap.dedent(
                f"""
                [backend]
                name = "dict"

                [backend.options]
                capacity_pages = {SLOTS}
                threads = 2
                """
            ),
            encoding="utf-8",
        )
    elif name == "kvcr":
        reason = kvcr_missing()
        if reason is not None:
            missing(reason)
        environ = {"KVCR_POLICY_BACKEND__NAME": "kvcr"}  # chosen like any value

    def build(
        profile: str = "default",
        overrides: dict[str, Any] | None = None,
        *,
        transport: Any = None,
    ) -> Pipeline:
        values = {**base, **(overrides or {})}
        if selector is not None:
            # The profile picks the backend; the named profile's values come in as overrides.
            named = load_config(profile, environ={}).changed()
            values = {path: value for path, (value, _) in named.items()} | values
            loaded = load_config(selector, environ={}, overrides=values)
        else:
            loaded = load_config(profile, environ=environ, overrides=values)
        pipeline = build_pipeline(loaded, transport=transport)
        assert pipeline.backend.name == name
        opened.append(pipeline)
        return pipeline

    build.backend = name  # type: ignore[attr-defined]
    yield build
    for pipeline in opened:
        pipeline.close()


def stored(make: Make, profile: str = "default", n: int = 12, **overrides: Any) -> Any:
    geo = geometry()
    buffer = pool_buffer(geo)
    pipeline = make(profile, overrides)
    # A pool name of its own: a peer keeps one tier per pool name, fresh for each test.
    pipeline.register_pool(f"kv-{uuid.uuid4().hex[:8]}", geo, buffer)
    keys = fresh_keys(n)
    assert pipeline.set(keys, token_indices(range(n), P)) == [True] * n
    return pipeline, geo, buffer, keys


# ---- store and restore ------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["default", "throughput"])
def test_restore_is_byte_exact(make: Make, profile: str) -> None:
    pipeline, geo, buffer, keys = stored(make, profile)
    view = pages_of(buffer, geo)
    expected = view[:, :12].copy()
    view[:, 20:32] = 0
    assert pipeline.get(keys, token_indices(range(20, 32), P)) == [True] * 12
    assert np.array_equal(view[:, 20:32], expected)
    stats = pipeline.stats()
    assert stats.pages_read == 12 and stats.pages_written == 12


def test_exists_and_get_use_the_leading_run(make: Make) -> None:
    pipeline, geo, buffer, keys = stored(make, n=6)
    asked = [*keys[:3], "absent", *keys[3:]]
    assert pipeline.exists(asked) == 3
    view = pages_of(buffer, geo)
    expected = view[:, :3].copy()
    view[:, 30:37] = 0
    got = pipeline.get(asked, token_indices(range(30, 37), P))
    assert got == [True] * 3 + [False] * 4
    assert np.array_equal(view[:, 30:33], expected)
    assert not view[:, 33:37].any()  # nothing after the first miss is read


def deleted(make: Make, pipeline: Pipeline, keys: list[str]) -> int:
    """``pipeline.delete(keys)``; on Mooncake, again (only ``delete``, which grants no lease)
    until every key is gone: every get and exists grants a lease (a set is confirmed by an
    exists) and a leased object is not removed before it ends (the Mooncake plugin's README)."""
    count = [pipeline.delete(keys)]
    if make.backend == "mooncake":  # type: ignore[attr-defined]

        def all_gone() -> bool:
            if count[0] < len(keys):
                count[0] += pipeline.delete(keys)
            return count[0] >= len(keys)

        wait_until(all_gone, "the Mooncake leases of a set's keys to end", 60, every=0.5)
    return count[0]


def test_a_set_of_present_keys_succeeds_and_delete_and_clear_forget(make: Make) -> None:
    pipeline, _, _, keys = stored(make, n=4)
    assert pipeline.set(keys, token_indices(range(10, 14), P)) == [True] * 4
    assert deleted(make, pipeline, keys[:2]) == 2
    assert pipeline.exists(keys) == 0
    assert pipeline.exists(keys[2:]) == 2
    pipeline.clear()
    assert pipeline.exists(keys[2:]) == 0


# ---- claims -----------------------------------------------------------------------------------


def test_a_page_being_read_is_never_evicted_or_overwritten(make: Make) -> None:
    """A full tier, a restore in small batches, and at each delivered batch a set of new keys
    that needs evictions: every page the restore reports must carry its stored bytes."""
    overrides = {"batching.read_batch_pages": 2, "batching.window_batches": 2}
    pipeline, geo, buffer, keys = stored(make, n=SLOTS, **overrides)
    view = pages_of(buffer, geo)
    expected = view[:, :SLOTS].copy()
    intruders = fresh_keys(4 * SLOTS)
    pressure: list[Any] = []

    def on_ready(count: int) -> None:
        batch = intruders[len(pressure) * 4 : len(pressure) * 4 + 4]
        view[:, 40:44] = 0xA5  # bytes that must never reach the tier under a claimed key
        try:
            pressure.append(pipeline.set(batch, token_indices(range(40, 44), P)))
        except CapacityError as err:  # every slot claimed: refusing is correct
            pressure.append(err)

    view[:, 20:36] = 0
    got = pipeline.get(keys, token_indices(range(20, 20 + SLOTS), P), on_ready=on_ready)
    assert pressure, "on_ready never ran"
    lead = got.index(False) if False in got else len(got)
    assert got == [True] * lead + [False] * (len(got) - lead)
    assert lead >= 2  # the first batch was delivered before any pressure
    assert np.array_equal(view[:, 20 : 20 + lead], expected[:, :lead])


# ---- fallback ---------------------------------------------------------------------------------


FLAKY = """
    from kvcr_policy import hookimpl

    class Flaky:
        \"\"\"Fails every second multi-page batch before a byte moves (the peer then sees a
        failed batch, exactly as after a lost connection); single pages pass.\"\"\"

        needs = frozenset()
        calls = 0

        def __init__(self, section, options):
            pass

        def prepare(self, d, allowed):
            if d.page_end.max(initial=0) > 1:
                Flaky.calls += 1
                if Flaky.calls % 2 == 0:
                    raise RuntimeError("injected failure")
            return d

    @hookimpl
    def kvcr_register_strategies(register):
        register("coalescing", "flaky", Flaky)
"""


def _faulty(make: Make, request: pytest.FixtureRequest) -> tuple[dict[str, Any], Any]:
    """Overrides and transport that make every second batch fail (after part of it moved,
    where the backend allows that)."""
    if make.backend == "dict":  # type: ignore[attr-defined]
        return {"backend.options.fail_every": 2}, None
    if make.backend == "kvcr":  # type: ignore[attr-defined]
        return _kvcr_faults(request.getfixturevalue("monkeypatch")), None
    if make.backend == "peer":  # type: ignore[attr-defined]
        fake_dist = request.getfixturevalue("fake_dist")
        fake_dist("kvcr-test-flaky", {"flaky": "kvcr_test_flaky"}, {"kvcr_test_flaky": FLAKY})
        return {"coalescing.strategy": "flaky"}, None
    if make.backend == "mooncake":  # type: ignore[attr-defined]
        return _flaky_mooncake(request.getfixturevalue("monkeypatch")), None
    count = {"n": 0}

    def fault(batch: CopyBatch) -> int | None:
        # Only batches of several pages fail (a page has 6 fragments here): retries get through.
        if len(batch.descriptors) <= geometry().fragments_per_page:
            return None
        count["n"] += 1
        return 1 if count["n"] % 2 == 0 else None

    return {}, MemoryTransport(fault=fault)


def _flaky_mooncake(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every second store call of several pages reports INTERNAL_ERROR for all but its first
    page (a real store call runs first, so some pages did move); single pages pass, so retries
    get through. (TRANSFER_FAIL, a segment that did not answer, is a miss instead, with the
    rest of its get: tests/plugins/mooncake/test_mooncake_faults.py.)"""
    from kvcr_policy_mooncake.client import StoreClient

    count = {"n": 0}

    def flaky(real: Callable[..., list[int]]) -> Callable[..., list[int]]:
        def call(self: Any, keys: list[str], *args: Any) -> list[int]:
            codes = real(self, keys, *args)
            if len(keys) > 1:
                count["n"] += 1
                if count["n"] % 2 == 0:
                    codes[1:] = [-1] * (len(codes) - 1)  # INTERNAL_ERROR
            return codes

        return call

    monkeypatch.setattr(StoreClient, "get", flaky(StoreClient.get))
    monkeypatch.setattr(StoreClient, "put", flaky(StoreClient.put))
    return {}


def _kvcr_faults(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Every second NIXL transfer KVCR submits for several pages fails at submission (KVCR then
    reports the whole copy FAILED, as after a transport error); single pages pass."""
    from kvcr.progress import _KVCRProgress

    original = _KVCRProgress.submit_transfer
    count = {"n": 0}
    planes = geometry().fragments_per_page

    def submit_transfer(self: Any, operation: str, local: Any, remote: Any, **kw: Any) -> Any:
        if len(local) > planes:
            count["n"] += 1
            if count["n"] % 2 == 0:
                raise RuntimeError("injected NIXL failure")
        return original(self, operation, local, remote, **kw)

    monkeypatch.setattr(_KVCRProgress, "submit_transfer", submit_transfer)
    return {}


def test_failed_batches_fall_back_page_by_page_and_stay_exact(
    make: Make, request: pytest.FixtureRequest
) -> None:
    faults, transport = _faulty(make, request)
    geo = geometry()
    buffer = pool_buffer(geo, 3)
    pipeline = make("default", {"batching.read_batch_pages": 3, **faults}, transport=transport)
    # A pool name of its own: a peer keeps one tier per pool name, fresh for each test.
    pipeline.register_pool(f"kv-{uuid.uuid4().hex[:8]}", geo, buffer)
    keys = fresh_keys(12)
    assert pipeline.set(keys, token_indices(range(12), P)) == [True] * 12
    view = pages_of(buffer, geo)
    expected = view[:, :12].copy()
    view[:, 20:32] = 0
    assert pipeline.get(keys, token_indices(range(20, 32), P)) == [True] * 12
    assert np.array_equal(view[:, 20:32], expected)
    assert sum(pipeline.stats().fallbacks.values()) > 0


# ---- windows ----------------------------------------------------------------------------------


def test_the_window_bounds_batches_in_flight_and_delivery_is_in_order(make: Make) -> None:
    overrides = {"batching.read_batch_pages": 2, "batching.window_batches": 2}
    pipeline, geo, buffer, keys = stored(make, n=12, **overrides)
    view = pages_of(buffer, geo)
    expected = view[:, :12].copy()
    view[:, 20:32] = 0
    ready: list[int] = []
    assert pipeline.get(keys, token_indices(range(20, 32), P), on_ready=ready.append) == [True] * 12
    assert ready == [2, 4, 6, 8, 10, 12]
    assert np.array_equal(view[:, 20:32], expected)
    stats = pipeline.stats()
    assert 1 <= stats.peak_inflight_batches <= 2
    assert stats.batches == 12  # 6 to store, 6 to restore


# ---- the test coalescer of the example plugin -------------------------------------------------


def test_a_third_party_coalescer_shapes_what_the_backend_moves(make: Make) -> None:
    if not example_installed():
        pytest.skip(EXAMPLE_MISSING)
    overrides = {"coalescing.strategy": "pieces", "coalescing.options.pieces": 3}
    pipeline, geo, buffer, keys = stored(make, n=8, **overrides)
    view = pages_of(buffer, geo)
    expected = view[:, :8].copy()
    view[:, 20:28] = 0
    assert pipeline.get(keys, token_indices(range(20, 28), P)) == [True] * 8
    assert np.array_equal(view[:, 20:28], expected)
    stats = pipeline.stats()
    planes = geo.fragments_per_page
    if pipeline.backend.capabilities >= {"coalesce", "split"}:
        # One merged run per plane and direction (8 consecutive pages), cut into 3 pieces.
        assert stats.descriptors_after == 2 * planes * 3
    else:  # a backend that takes no shaped descriptors gets them plain
        assert stats.descriptors_after == stats.descriptors_before


# ---- lifetime ---------------------------------------------------------------------------------


def test_close_waits_for_a_running_call_and_later_calls_raise(make: Make) -> None:
    pipeline, _, _, keys = stored(make, n=12, **{"batching.read_batch_pages": 1})
    started, results = threading.Event(), []

    def restore() -> None:
        results.append(
            pipeline.get(keys, token_indices(range(20, 32), P), on_ready=lambda n: started.set())
        )

    worker = threading.Thread(target=restore)
    worker.start()
    assert started.wait(30)
    pipeline.close()
    worker.join(30)
    assert results == [[True] * 12]  # close waited for the whole call
    with pytest.raises(ClosedError):
        pipeline.get(keys, token_indices(range(20, 32), P))
    with pytest.raises(ClosedError):
        pipeline.exists(keys)
    pipeline.close()  # idempotent
    for call in (pipeline.stats, pipeline.audit):  # every call after close (red team S11)
        with pytest.raises(ClosedError):
            call()
    assert pipeline.final_stats is not None


# ---- one rule for keys (red team S11: the local and peer tiers disagreed) --------------------


@pytest.mark.parametrize(
    ("keys", "error", "match"),
    [
        ([1, 2], UsageError, "position 0 must be a str, got int"),
        ([None], UsageError, "must be a str, got NoneType"),
        ([b"k"], UsageError, "must be a str, got bytes"),
        ([["unhashable"]], UsageError, "must be a str, got list"),
        ("ab", UsageError, "list or tuple of str, got str"),
        ((k for k in ["a", "b"]), UsageError, "got generator"),
        (["x" * 1025], ArgumentError, "1025 bytes in UTF-8; a key has 1 to 1024"),
        (["é" * 513], ArgumentError, "1026 bytes"),
        ([""], ArgumentError, "0 bytes"),
        (["\ud800"], ArgumentError, "not valid Unicode"),
    ],
    ids=["int", "none", "bytes", "unhashable", "str", "generator", "long", "wide", "empty", "lone"],
)
def test_one_key_rule_on_every_backend(make: Make, keys: Any, error: type, match: str) -> None:
    pipeline, _, _, _ = stored(make, n=1)
    for call in ("exists", "get", "set", "delete"):
        args = (keys,) if call in ("exists", "delete") else (keys, token_indices([20], P))
        with pytest.raises(error, match=match):
            getattr(pipeline, call)(*args)
    assert pipeline.exists(["x" * 1024]) == 0  # the longest key is fine everywhere


def test_a_key_repeated_in_one_set_stores_its_first_page_on_every_backend(make: Make) -> None:
    pipeline, geo, buffer, keys = stored(make, n=1)
    view = pages_of(buffer, geo)
    twice = fresh_keys(1)[0]
    assert pipeline.set([twice, keys[0], twice], token_indices([5, 6, 7], P)) == [True] * 3
    view[:, 20:23] = 0
    assert pipeline.get([twice, twice], token_indices([20, 21], P)) == [True, True]
    assert np.array_equal(view[:, 20], view[:, 5]) and np.array_equal(view[:, 21], view[:, 5])


def test_a_probe_of_nothing_or_more_than_the_pool_is_refused(make: Make) -> None:
    pipeline, geo, _, _ = stored(make, n=1)
    for nbytes in (0, -1, 1.5, geo.nbytes + 1):  # the peer stalled on 0 (red team S11)
        with pytest.raises(PoolError, match="probe"):
            pipeline.probe(nbytes)  # type: ignore[arg-type]
