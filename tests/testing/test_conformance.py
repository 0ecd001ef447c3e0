"""The conformance suite (kvcr_policy.testing) over every backend of the repository: the
built-in ``dram``, ``peer`` (a real ``kvcr-policy serve`` over ucxx on loopback), ``host`` (a
real host tier process), ``file`` (slot files in the test's own folder) and ``cascade`` (a DRAM
tier of a few pages in front of such files, so pages are demoted and promoted), the example
plugin's ``dict``, the ``kvcr`` plugin (the real KVCR runner
over NIXL) and the ``mooncake`` plugin (a real ``mooncake_master`` on loopback ports).

A backend joins with one entry in :data:`BACKENDS`: its name and the configuration values that
select it and give its tier room for the suite's pages.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from kvcr_policy import build_pipeline, load_config
from kvcr_policy.backends.dram.transports.base import CopyBatch
from kvcr_policy.backends.dram.transports.memory import MemoryTransport
from kvcr_policy.errors import ConformanceError, TransportError
from kvcr_policy.pipeline import Pipeline
from kvcr_policy.testing import CHECKS, SLOTS, check_backend, pipeline_factory
from kvcr_policy.testing.pools import geometry
from tests.conftest import EXAMPLE_MISSING, example_installed, kvcr_missing
from tests.plugins.mooncake.mooncake_helpers import need_mooncake
from tests.support.host_tiers import stop_host_tiers
from tests.support.installs import missing

PAGE_BYTES = geometry().page_bytes


@pytest.fixture(scope="module")
def peer_server() -> Iterator[Any]:
    """A ``kvcr-policy serve`` whose tier holds SLOTS pages per pool (module-wide)."""
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
            "transport.options.max_tiers": 128,  # a pool name of its own per check
        }
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mooncake_master() -> Iterator[Any]:
    need_mooncake()
    from kvcr_policy_mooncake.master import MasterProcess

    # Leases of 1 s (10 s by default): a delete after a get waits for its lease to end; the
    # segment holds every page of the suite, so no eviction ever needs a lease to guard a read.
    with MasterProcess(args=["--default_kv_lease_ttl=1000"]) as master:
        yield master


@pytest.fixture(scope="module")
def host_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("host-tiers")
    yield folder
    stop_host_tiers(folder)


def _peer(request: pytest.FixtureRequest) -> dict[str, Any]:
    server = request.getfixturevalue("peer_server")
    return {
        "transport.name": "ucx",
        "transport.options.peer": server.address,
        "transport.options.heartbeat_s": 0.5,
        "transport.op_timeout_s": 10,
    }


def _host(request: pytest.FixtureRequest) -> dict[str, Any]:
    folder = request.getfixturevalue("host_folder")
    return {
        "backend.name": "host",
        "backend.options.dir": str(folder),
        "placement.capacity_bytes": "16MiB",
    }


def _file(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {
        "backend.name": "file",
        "backend.options.path": str(request.getfixturevalue("tmp_path")),
        "backend.options.min_free_bytes": 0,
        "placement.capacity_bytes": SLOTS * PAGE_BYTES,
    }


def _cascade(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {
        "backend.name": "cascade",
        "backend.options.file.path": str(request.getfixturevalue("tmp_path")),
        "backend.options.file.min_free_bytes": 0,
        "backend.options.file.capacity_bytes": SLOTS * PAGE_BYTES,
        "placement.capacity_bytes": 4 * PAGE_BYTES,  # DRAM: a few pages, the rest on disk
    }


def _dict(request: pytest.FixtureRequest) -> dict[str, Any]:
    if not example_installed():
        pytest.skip(EXAMPLE_MISSING)
    return {"backend.name": "dict", "backend.options.capacity_pages": SLOTS}


def _kvcr(request: pytest.FixtureRequest) -> dict[str, Any]:
    reason = kvcr_missing()
    if reason is not None:
        missing(reason)
    return {"backend.name": "kvcr"}


def _mooncake(request: pytest.FixtureRequest) -> dict[str, Any]:
    # Mooncake's smallest segment (16 MiB) holds far more than SLOTS pages.
    master = request.getfixturevalue("mooncake_master")
    return {
        "backend.name": "mooncake",
        "backend.options.master": master.address,
        "backend.options.segment_bytes": "16MiB",
    }


#: Every backend of the repository: name -> the values that select it (given the test request,
#: for the servers its fixtures start).
BACKENDS: dict[str, Callable[[pytest.FixtureRequest], dict[str, Any]]] = {
    "dram": lambda request: {"placement.capacity_bytes": SLOTS * PAGE_BYTES},
    "peer": _peer,
    "host": _host,
    "file": _file,
    "cascade": _cascade,
    "dict": _dict,
    "kvcr": _kvcr,
    "mooncake": _mooncake,
}


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_every_backend_conforms(backend: str, check: str, request: pytest.FixtureRequest) -> None:
    built = pipeline_factory(BACKENDS[backend](request))

    def factory(overrides: Mapping[str, Any]) -> Pipeline:
        pipeline = built(overrides)
        assert pipeline.backend.name == backend
        return pipeline

    CHECKS[check](factory)


class _Lossy(MemoryTransport):
    """A broken backend's copy: it drops the last descriptor of a batch and reports success."""

    def __init__(self) -> None:
        super().__init__(fault=lambda batch: max(1, len(batch.descriptors) - 1))

    def copy(self, batch: CopyBatch) -> None:
        with contextlib.suppress(TransportError):  # the silent loss the suite must catch
            super().copy(batch)


def test_a_backend_that_loses_bytes_fails_and_the_error_names_the_check() -> None:
    def factory(overrides: Mapping[str, Any]) -> Pipeline:
        values = {"placement.capacity_bytes": SLOTS * PAGE_BYTES, **overrides}
        return build_pipeline(load_config(environ={}, overrides=values), transport=_Lossy())

    with pytest.raises(ConformanceError, match=r"byte_exact: .*restored bytes differ"):
        check_backend(factory, only=("byte_exact",))
    CHECKS["bad_input"](factory)  # what it does not touch still passes
