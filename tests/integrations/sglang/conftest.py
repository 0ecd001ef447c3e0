"""Tiers for the SGLang tests that run on every tier: the embedded ``dram`` tier, a ``peer``
(a real ``kvcr-policy serve`` over UCX), ``mooncake`` (a real ``mooncake_master``; each
backend contributes its own segment), ``file`` (slot files in the test's own folder) and
``cascade`` (a small DRAM tier in front of such files, so pages go both ways).
``tier_overrides`` is what a backend's extra_config ``overrides`` add to reach the tier;
servers are started once per module and stopped by PID.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.integrations.conftest import TIER

TIERS = ["dram", "peer", "mooncake", "file", "cascade"]


@pytest.fixture(scope="module")
def peer_server() -> Iterator[Any]:
    from tests.backends.peer.peer_helpers import SERVER_SETS, need_ucxx

    need_ucxx()
    from kvcr_policy.backends.peer.process import PeerProcess

    server = PeerProcess(SERVER_SETS)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mooncake_master() -> Iterator[Any]:
    from tests.plugins.mooncake.mooncake_helpers import need_mooncake

    need_mooncake()
    from kvcr_policy_mooncake.master import MasterProcess

    with MasterProcess() as process:
        yield process


def overrides_for(tier: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """The config overrides that put a backend on ``tier`` (servers started on demand)."""
    if tier == "dram":
        return {"placement.capacity_bytes": TIER}
    if tier == "peer":
        server = request.getfixturevalue("peer_server")
        return {
            "transport.name": "ucx",
            "transport.options.peer": server.address,
            "transport.options.heartbeat_s": 0.5,
        }
    if tier == "mooncake":
        master = request.getfixturevalue("mooncake_master")
        return {
            "backend.name": "mooncake",
            "backend.options.master": master.address,
            "backend.options.segment_bytes": TIER,
        }
    if tier == "file":
        return {
            "backend.name": "file",
            "backend.options.path": str(request.getfixturevalue("tmp_path")),
            "backend.options.capacity_bytes": TIER,
            "backend.options.min_free_bytes": 0,
        }
    if tier == "cascade":
        return {
            "backend.name": "cascade",
            "placement.capacity_bytes": "1MiB",  # a few pages: the rest is demoted to disk
            "backend.options.file.path": str(request.getfixturevalue("tmp_path")),
            "backend.options.file.capacity_bytes": TIER,
            "backend.options.file.min_free_bytes": 0,
        }
    raise AssertionError(f"unknown tier {tier!r}")


@pytest.fixture(params=TIERS)
def tier_overrides(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Overrides for each tier in turn (the test runs once per tier)."""
    return overrides_for(request.param, request)
