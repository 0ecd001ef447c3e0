"""The conformance suite's pool: a small geometry, a buffer of seeded random bytes, its pages
and their token indices, and keys no other run uses."""

from __future__ import annotations

import uuid

import numpy as np

from ..geometry import PoolGeometry

__all__ = [
    "PAGE_TOKENS",
    "POOL_PAGES",
    "SLOTS",
    "fresh_keys",
    "geometry",
    "pages_of",
    "pool",
    "tokens",
]

#: Pages the backend's tier must hold at least (the claims check fills that many).
SLOTS = 16
#: Tokens per page of the suite's pool.
PAGE_TOKENS = 4
#: Pages of the suite's pool.
POOL_PAGES = 48


def geometry() -> PoolGeometry:
    """The suite's pool: 3 layers, 2 heads of 16 float16 values, 4 tokens a page, 48 pages
    (page-scattered fragments: 6 per page, as engines lay a layer-first cache out)."""
    return PoolGeometry(
        name="kv",
        layout="layer_first",
        layers=3,
        heads=2,
        head_dim=16,
        dtype="float16",
        page_size=PAGE_TOKENS,
        tokens=PAGE_TOKENS * POOL_PAGES,
    )


def pool(geo: PoolGeometry, seed: int = 0) -> np.ndarray:
    """A pool buffer of ``geo.shape`` holding seeded random bytes."""
    buffer = np.empty(geo.shape, dtype=np.float16)
    raw = buffer.view(np.uint8).reshape(-1)
    raw[:] = np.random.default_rng(seed).integers(0, 256, raw.size, dtype=np.uint8)
    return buffer


def pages_of(buffer: np.ndarray, geo: PoolGeometry) -> np.ndarray:
    """A ``(fragments, pages, fragment bytes)`` byte view of the pool: page p is ``[:, p]``."""
    return buffer.view(np.uint8).reshape(geo.fragments_per_page, geo.pages, geo.fragment_bytes)


def tokens(pages: object) -> np.ndarray:
    """The token indices of whole pages, as an engine passes them: ``page·P + arange(P)``."""
    array = np.asarray(pages, dtype=np.int64).reshape(-1, 1)
    return (array * PAGE_TOKENS + np.arange(PAGE_TOKENS, dtype=np.int64)).reshape(-1)


def fresh_keys(n: int) -> list[str]:
    """``n`` keys no other check uses (a tier may outlive a check, as a server's does)."""
    salt = uuid.uuid4().hex[:8]
    return [f"conformance-{salt}-{i}" for i in range(n)]
