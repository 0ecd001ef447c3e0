"""Fixtures of the peer tests: a real `kvcr-policy serve` process and pipelines that use it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from kvcr_policy.geometry import PoolGeometry

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
        pytest.skip(f"ucxx cannot be imported ({err}); pip install 'kvcr-policy[ucx]'")


@pytest.fixture(scope="module")
def peer() -> Iterator[Any]:
    """One server process for the module's tests."""
    need_ucxx()
    from kvcr_policy.peer.bench import PeerProcess

    server = PeerProcess(SERVER_SETS)
    yield server
    server.stop()


def geometry(
    layout: str = "layer_first", *, pages: int = 8, mla: bool = False, name: str = "kv"
) -> PoolGeometry:
    return PoolGeometry(
        name=name,
        layout=layout,
        layers=3,
        heads=1 if mla else 2,
        head_dim=16,  # type: ignore[arg-type]
        dtype="float16",
        page_size=4,
        tokens=4 * pages,
        mla=mla,
    )


def pool_buffer(geo: PoolGeometry, seed: int = 0) -> np.ndarray:
    buffer = np.empty(geo.shape, dtype=np.float16)
    raw = buffer.view(np.uint8).reshape(-1)
    raw[:] = np.random.default_rng(seed).integers(0, 256, raw.size, dtype=np.uint8)
    return buffer


def pages_of(buffer: np.ndarray, geo: PoolGeometry) -> np.ndarray:
    """(planes, pages, fragment bytes) byte view: page p is [:, p]."""
    return buffer.view(np.uint8).reshape(geo.fragments_per_page, geo.pages, geo.fragment_bytes)


def token_indices(geo: PoolGeometry, pages: range | np.ndarray) -> np.ndarray:
    pages = np.asarray(pages, dtype=np.int64)
    return (pages[:, None] * geo.page_size + np.arange(geo.page_size)).reshape(-1)


def new_keys(n: int) -> list[str]:
    salt = uuid.uuid4().hex[:8]
    return [f"{salt}-{i}" for i in range(n)]


@pytest.fixture
def connect(peer: Any) -> Iterator[Callable[..., Any]]:
    """``connect(profile, address, **overrides)``: a pipeline on the peer, closed after."""
    from kvcr_policy import build_pipeline, load_config

    opened: list[Any] = []

    def make(profile: str | None = None, address: str | None = None, **overrides: Any) -> Any:
        values = {
            "transport.name": "ucx",
            "transport.options.peer": address or peer.address,
            "transport.options.heartbeat_s": 0.5,
            **{key.replace("__", "."): value for key, value in overrides.items()},
        }
        pipeline = build_pipeline(load_config(profile=profile, overrides=values))
        opened.append(pipeline)
        return pipeline

    yield make
    for pipeline in opened:
        pipeline.close()
