"""Helpers of the peer tests: small pools, their pages, fresh keys, the server settings."""

from __future__ import annotations

import uuid

import numpy as np

from kvcr_policy.geometry import PoolGeometry
from tests.installs import missing

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
        missing(f"ucxx cannot be imported ({err}); pip install 'kvcr-policy[ucx]'")


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
