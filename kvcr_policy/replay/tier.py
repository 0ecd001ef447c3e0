"""The replay's own peer tier: ``kvcr-policy serve`` in a child process for one run, with the
tenant bandwidth limit of ``--tier-rate`` (``security.tenant_rate``), and the overrides that
point the run's backend at it. A fresh server per run: each run's first pass fills its tier."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .setup import ReplaySetup

__all__ = ["peer_tier", "run_tier"]


@contextmanager
def run_tier(
    setup: ReplaySetup, profile: str | None, capacity_bytes: int
) -> Iterator[dict[str, Any]]:
    """:func:`peer_tier` for a run with a tier (``profile``), nothing for the run without."""
    if profile is None:
        yield {}
        return
    with peer_tier(setup, capacity_bytes) as overrides:
        yield overrides


@contextmanager
def peer_tier(setup: ReplaySetup, capacity_bytes: int) -> Iterator[dict[str, Any]]:
    """Overrides for a run's tier: none unless ``--backend peer``; then a loopback server
    (insecure: one tenant, the replay's) of ``capacity_bytes`` a pool, limited to
    ``--tier-rate`` when given, stopped when the run ends."""
    if setup.backend != "peer":
        yield {} if setup.backend is None else {"backend.name": setup.backend}
        return
    from ..backends.peer.process import PeerProcess

    sets: dict[str, Any] = {
        "security.insecure": True,
        "placement.capacity_bytes": capacity_bytes,
    }
    if setup.tier_rate is not None:
        sets["security.tenant_rate"] = setup.tier_rate
    server = PeerProcess(sets)
    limit = f", {setup.tier_rate} per tenant" if setup.tier_rate else ""
    print(f"replay: peer tier at {server.address}{limit}", file=sys.stderr, flush=True)
    try:
        yield {
            "backend.name": "peer",
            "transport.name": "ucx",
            "transport.options.peer": server.address,
            "security.insecure": True,
        }
    finally:
        server.stop()
