"""Fixtures of the peer tests: a real `kvcr-policy serve` process and pipelines that use it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.backends.peer.peer_helpers import SERVER_SETS, need_ucxx
from tests.support.load import TEST_HOG_S, CpuHog


@pytest.fixture(params=["quiet", "hog"])
def load(request: pytest.FixtureRequest) -> Iterator[str]:
    """The test runs once on a quiet machine and once under a CPU hog (two busy processes per
    core, :mod:`tests.support.load`): an inference host is a busy host."""
    if request.param == "quiet":
        yield "quiet"
        return
    with CpuHog(seconds=TEST_HOG_S):
        yield "hog"


@pytest.fixture(scope="module")
def peer(request: pytest.FixtureRequest) -> Iterator[Any]:
    """One server process for the module's tests, started with the module's ``PEER_SETS``
    when it has them (else ``SERVER_SETS``)."""
    need_ucxx()
    from kvcr_policy.backends.peer.process import PeerProcess

    server = PeerProcess(getattr(request.module, "PEER_SETS", SERVER_SETS))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def worker() -> Iterator[Any]:
    """A UCX worker of this process (a link of its UCX thread): a real worker address, so that
    a raw client's HELLO and AUTH get their WELCOME."""
    need_ucxx()
    from kvcr_policy.backends.peer.options import UcxOptions
    from kvcr_policy.backends.peer.worker import acquire_worker

    loop = acquire_worker(UcxOptions())
    link = loop.submit(loop.open_link, "raw clients").result()
    yield link
    loop.submit(link.retire, 0.0).result()
    loop.release()


@pytest.fixture
def connect(peer: Any) -> Iterator[Callable[..., Any]]:
    """``connect(profile, address, **overrides)``: a pipeline on the peer, closed after. Pages
    move over UCX (``transport.options.shared_memory`` off) unless the test asks otherwise:
    the shared-memory path has its own tests (test_peer_shared_memory.py)."""
    from kvcr_policy import build_pipeline, load_config

    opened: list[Any] = []

    def make(profile: str | None = None, address: str | None = None, **overrides: Any) -> Any:
        values = {
            "transport.name": "ucx",
            "transport.options.peer": address or peer.address,
            "transport.options.heartbeat_s": 0.5,
            "transport.options.shared_memory": "off",
            **{key.replace("__", "."): value for key, value in overrides.items()},
        }
        pipeline = build_pipeline(load_config(profile=profile, overrides=values))
        opened.append(pipeline)
        return pipeline

    yield make
    for pipeline in opened:
        pipeline.close()
