"""What a tenant can make a server hold, over real ucxx on loopback (red team 2026-12-b, B1):
the quota bounds a tenant's tiers with their bookkeeping, however small its pages.

The bound asserted is the README's: a tenant's tiers cost at most
``security.tenant_quota_bytes``, and each of its sessions at most ``SESSION_BYTES`` more (its
UCX worker and buffers: 2.4 MiB measured per session, 6.7 MiB for the first one, which also
starts the server's UCX context). The margin is that stated figure, not a guess at the
machine: the attack's own bookkeeping comes to about 40 MiB of the 48 MiB quota (2.5 KiB per
slot of SLOT_COST's 3 KiB), so the server's growth is measured at about 50 MiB against a
bound of 64 MiB; before the fix it was 600 MiB.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvcr_policy.errors import CapacityError
from kvcr_policy.geometry import PoolGeometry
from tests.backends.peer.tenants import client_factory, rss_bytes, start_peer, tenants_dir

pytestmark = [pytest.mark.ucx, pytest.mark.slow]

QUOTA = 48 << 20
#: README (Security): what a session may cost the server besides its tenant's tiers.
SESSION_BYTES = 16 << 20


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tenants_dir(tmp_path_factory.mktemp("memory"))


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[Any]:
    peer = start_peer(
        folder,
        **{"security.tenant_quota_bytes": QUOTA, "placement.capacity_bytes": QUOTA},
    )
    yield peer
    peer.stop()


def test_tiny_pages_cost_no_more_than_the_quota(server: Any, folder: Path) -> None:
    """The red team's attach of 1-byte pages, then every slot filled twice with 1 KiB keys
    (each slot holding a key, and an evicted one remembered for the metrics)."""
    before = rss_bytes(server.proc.pid)
    for make in client_factory(server.address):
        pipeline = make(folder / "alice")
        tiny = PoolGeometry("tiny", "page_first", 1, 1, 1, "float16", 1, 1024, True)
        pipeline.register_pool("tiny", tiny, np.zeros(tiny.shape, dtype=np.float16))
        tier = pipeline.stats().to_dict()["pools"]["tiny"]["peer"]["remote"]["tier"]
        slots = tier["capacity"]
        assert 0 < slots < QUOTA // 3000
        for round_ in range(2):
            for start in range(0, slots, 1024):
                n = min(1024, slots - start)
                keys = [f"{round_}-{start + i}-".ljust(1024, "k") for i in range(n)]
                assert pipeline.set(keys, np.arange(n)) == [True] * n
        tier = pipeline.stats().to_dict()["pools"]["tiny"]["peer"]["remote"]["tier"]
        assert tier["keys"] == slots and tier["evictions"] == slots
        other = PoolGeometry("tiny2", "page_first", 1, 1, 1, "float16", 1, 1024, True)
        with pytest.raises(CapacityError, match="tenant_quota_bytes"):
            pipeline.register_pool("tiny2", other, np.zeros(other.shape, dtype=np.float16))
        grown = rss_bytes(server.proc.pid) - before
        assert grown <= QUOTA + SESSION_BYTES, f"{grown >> 20} MiB for a {QUOTA >> 20} MiB quota"
