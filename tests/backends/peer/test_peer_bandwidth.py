"""`serve`'s per-tenant bandwidth (security.tenant_rate): token buckets driven by byte counts
and an injected clock, and a real server whose claims and reservations take their bytes from
the tenant's bucket (the answer deferred while the bucket is in debt). No test here times
anything."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kvcr_policy.backends.peer.server.bandwidth import BURST_S, TenantBandwidth, TokenBucket
from kvcr_policy.config.loading import load_config
from kvcr_policy.errors import ConfigError
from tests.backends.peer.peer_helpers import need_ucxx
from tests.support.pools import fresh_keys, geometry, pages_of, pool_buffer, token_indices


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_lets_its_burst_through_then_paces_at_its_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=1000.0, burst=100.0, clock=clock)
    assert bucket.take(100) == 0.0  # the burst
    assert bucket.take(500) == pytest.approx(0.5)  # 500 bytes of debt at 1000 B/s
    assert bucket.take(500) == pytest.approx(1.0)  # queued behind the first
    clock.now = 1.0  # one second paid 1000 bytes: the debt is back to 0
    assert bucket.take(0) == 0.0
    clock.now = 10.0  # idle: refilled to its burst, never beyond
    assert bucket.take(100) == 0.0 and bucket.take(1) == pytest.approx(0.001)


def test_tenants_have_buckets_of_their_own_and_no_rate_is_no_limit() -> None:
    clock = Clock()
    limited = TenantBandwidth(1e6, clock)
    burst = int(1e6 * BURST_S)
    assert limited.delay("alice", burst) == 0.0
    assert limited.delay("alice", 1_000_000) == pytest.approx(1.0)
    assert limited.delay("bob", burst) == 0.0  # alice's debt is hers alone
    assert TenantBandwidth(None, clock).delay("alice", 1 << 40) == 0.0


def test_the_rate_needs_a_unit_and_serve_has_a_flag_for_it() -> None:
    loaded = load_config(environ={}, overrides={"security.tenant_rate": "50MB/s"})
    assert loaded.config.security.tenant_rate == pytest.approx(0.05)  # GB/s
    with pytest.raises(ConfigError, match="expected a rate"):
        load_config(environ={}, overrides={"security.tenant_rate": 50})


class Recording(TenantBandwidth):
    """The server's buckets on a clock that never moves, recording each request's bytes."""

    def __init__(self, rate: float) -> None:
        super().__init__(rate, Clock())
        self.taken: list[tuple[str, int]] = []

    def delay(self, tenant: str, nbytes: int) -> float:
        self.taken.append((tenant, nbytes))
        return super().delay(tenant, nbytes)


@pytest.fixture
def limited_peer() -> Iterator[Any]:
    """An in-process server with a tenant rate, its buckets on a frozen clock."""
    need_ucxx()
    from kvcr_policy.backends.peer.options import UcxOptions
    from kvcr_policy.backends.peer.server.server import PeerServer

    overrides = {"placement.capacity_bytes": "64MiB", "security.tenant_rate": "50MB/s"}
    server = PeerServer(load_config(environ={}, overrides=overrides), options=UcxOptions())
    assert server.bandwidth.rate == pytest.approx(50e6)
    with server:
        yield server


@pytest.mark.ucx
@pytest.mark.parametrize("shared_memory", ["off", "auto"])
def test_reads_and_writes_take_their_bytes_from_the_tenants_bucket(
    limited_peer: Any, shared_memory: str
) -> None:
    from kvcr_policy import build_pipeline

    # 10 kB/s on a clock that never moves: past the burst (1 kB), each answer waits for its
    # debt (a fraction of a second here), on the server loop's own timers.
    limited_peer.bandwidth = recording = Recording(rate=1e4)
    overrides = {
        "transport.name": "ucx",
        "transport.options.peer": limited_peer.address,
        "transport.options.heartbeat_s": 0.5,
        "transport.options.shared_memory": shared_memory,
    }
    pipeline = build_pipeline(load_config(environ={}, overrides=overrides))
    try:
        geo = geometry(pages=8, name="paced")
        buffer = pool_buffer(geo, 3)
        pipeline.register_pool("paced", geo, buffer)
        keys = fresh_keys(4)
        assert pipeline.set(keys, token_indices(range(4), geo.page_size), "paced") == [True] * 4
        view = pages_of(buffer, geo)
        view[:, 4:] = 0
        got = pipeline.get(keys, token_indices(range(4, 8), geo.page_size), "paced")
        assert got == [True] * 4
        assert np.array_equal(view[:, :4], view[:, 4:])
    finally:
        pipeline.close()
    assert sum(n for _, n in recording.taken) == 2 * 4 * geo.page_bytes  # stored + restored
    assert {tenant for tenant, _ in recording.taken} == {"default"}
