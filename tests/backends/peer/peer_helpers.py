"""Helpers of the peer tests: the server, its settings, and pools big enough to kill mid-read.

Small pools, their pages and fresh keys come from :mod:`tests.support.pools`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from kvcr_policy import load_config
from kvcr_policy.backends.peer.process import PeerProcess
from kvcr_policy.config.schema import PolicyConfig
from kvcr_policy.errors import BenchError
from kvcr_policy.geometry import PoolGeometry
from tests.support.installs import missing

SERVER_SETS = {
    "transport.name": "ucx",
    "transport.op_timeout_s": 10,
    "placement.capacity_bytes": "256MiB",
    "transport.options.heartbeat_s": 0.5,
}


def need_ucxx() -> None:
    try:
        import ucxx  # noqa: F401
    except Exception as err:  # ImportError, or a broken native library
        missing(f"ucxx cannot be imported ({err}); pip install torch==2.13.0 -e '.[ucx]'")


def promised_s(config: PolicyConfig) -> float:
    """How long docs/peer.md gives a side loaded with ``config`` to settle a fault (a peer killed
    or stopped mid-transfer): ``transport.op_timeout_s``, plus one ``heartbeat_s`` of slack for
    a worker loop that a busy host ran late. That slack is a third of what the peers themselves
    tolerate: a peer is declared dead after three silent heartbeats (and a second)."""
    return config.transport.op_timeout_s + float(config.transport.options["heartbeat_s"])


def server_config(sets: Mapping[str, object] = SERVER_SETS) -> PolicyConfig:
    """The configuration a server started with ``--set`` ``sets`` runs with."""
    return load_config(overrides=dict(sets), environ={}).config


def big_geometry(name: str) -> PoolGeometry:
    """layer_first, 32 fragments of 64 KiB per page (2 MiB pages): the default profile sends
    4,096 messages for 128 pages, a read that lasts long enough to be caught in flight."""
    return PoolGeometry(
        name=name,
        layout="layer_first",
        layers=16,
        heads=8,
        head_dim=128,
        dtype="float16",
        page_size=32,
        tokens=32 * 256,
    )


class Serve(PeerProcess):
    """``kvcr-policy serve`` as a child process, driven only through its command line: the one
    JSON line it prints on start, its log on stderr, and SIGTERM. ``python``: the arguments of
    this Python that start the CLI (``-c`` and a script, to run serve with something changed)."""

    def __init__(
        self,
        sets: Mapping[str, object],
        *,
        listen: str | None = "127.0.0.1:0",
        args: Sequence[str] = (),
        python: Sequence[str] = ("-m", "kvcr_policy"),
        timeout: float = 60.0,
    ) -> None:
        self._python = tuple(python)
        try:
            super().__init__(sets, listen=listen, args=args, timeout=timeout)
        except BenchError as err:
            raise AssertionError(str(err)) from None

    def launcher(self) -> list[str]:
        return [sys.executable, *self._python]
