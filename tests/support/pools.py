"""Test pools: geometries, buffers of random bytes, their pages and token indices, fresh keys.

Every suite builds its pools here, so the arithmetic that addresses a page (descriptors do it
in bytes; these helpers do it through the buffer's axes, as SGLang allocates them) is written
once. A suite states its own sizes through :func:`geometry`'s arguments.
"""

from __future__ import annotations

import uuid

import numpy as np

from kvcr_policy.geometry import PoolGeometry

__all__ = [
    "BUFFER_KINDS",
    "copy_buffer",
    "fresh_keys",
    "geometry",
    "keys_of",
    "page_bytes",
    "page_slice",
    "pages_of",
    "pool_buffer",
    "random_buffer",
    "raw_bytes",
    "scramble",
    "token_indices",
]

#: Tokens per page in the suites' small geometries.
P = 4


def geometry(
    layout: str = "layer_first",
    *,
    pages: int = 48,
    mla: bool = False,
    name: str = "kv",
    layers: int = 3,
    head_dim: int = 16,
    dtype: str = "float16",
    page_size: int = P,
    device: str = "cpu",
) -> PoolGeometry:
    """A pool of ``pages`` pages: 2 heads (1 for MLA), the other sizes as given."""
    return PoolGeometry(
        name=name,
        layout=layout,  # type: ignore[arg-type]
        layers=layers,
        heads=1 if mla else 2,
        head_dim=head_dim,
        dtype=dtype,
        page_size=page_size,
        tokens=page_size * pages,
        mla=mla,
        device=device,
    )


def pool_buffer(geo: PoolGeometry, seed: int = 0) -> np.ndarray:
    """A float16 numpy pool of ``geo.shape`` holding random bytes (seeded)."""
    buffer = np.empty(geo.shape, dtype=np.float16)
    raw = buffer.view(np.uint8).reshape(-1)
    raw[:] = np.random.default_rng(seed).integers(0, 256, raw.size, dtype=np.uint8)
    return buffer


def pages_of(buffer: np.ndarray, geo: PoolGeometry) -> np.ndarray:
    """A (fragments, pages, fragment bytes) byte view of the pool: page p is ``[:, p]``."""
    return buffer.view(np.uint8).reshape(geo.fragments_per_page, geo.pages, geo.fragment_bytes)


def fresh_keys(n: int) -> list[str]:
    """``n`` keys no other test uses (a tier outlives a test on a shared server)."""
    salt = uuid.uuid4().hex[:8]
    return [f"{salt}-{i}" for i in range(n)]


def keys_of(prefix: str, count: int) -> list[str]:
    """``prefix0`` .. ``prefix{count-1}``."""
    return [f"{prefix}{i}" for i in range(count)]


BUFFER_KINDS = ("torch-bfloat16", "numpy-float16")


def page_slice(geometry: PoolGeometry, page: int) -> tuple[object, ...]:
    """The index of every element of page ``page`` in a buffer of ``geometry.shape``."""
    tokens = slice(page * geometry.page_size, (page + 1) * geometry.page_size)
    every = slice(None)
    if geometry.mla:  # (L, T, 1, D) | (T, L, 1, D) | (T/P, L, P, 1, D)
        by_layout: dict[str, tuple[object, ...]] = {
            "layer_first": (every, tokens),
            "page_first": (tokens,),
            "page_first_direct": (page,),
        }
    else:  # (2, L, T, H, D) | (2, T, L, H, D) | (2, T/P, L, P, H, D) | (2, T/P, H, P, L, D)
        by_layout = {
            "layer_first": (every, every, tokens),
            "page_first": (every, tokens),
            "page_first_direct": (every, page),
            "page_head": (every, page),
        }
    return by_layout[geometry.layout]


def token_indices(pages: object, page_size: int) -> np.ndarray:
    """Host token indices of whole pages, as SGLang passes them: ``page·P + arange(P)``."""
    array = np.asarray(pages, dtype=np.int64).reshape(-1, 1)
    return (array * page_size + np.arange(page_size, dtype=np.int64)).reshape(-1)


def random_buffer(geometry: PoolGeometry, rng: np.random.Generator, kind: str) -> object:
    """A C-contiguous pool buffer of random bits (NaNs included; tests compare bits)."""
    bits = rng.integers(0, 1 << 16, size=geometry.shape, dtype=np.uint16)
    if kind == "torch-bfloat16":
        import torch

        return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    if kind == "numpy-float16":
        return bits.view(np.float16)
    raise ValueError(f"unknown buffer kind {kind!r}; expected one of {BUFFER_KINDS}")


def raw_bytes(buffer: object) -> np.ndarray:
    """A flat uint8 view sharing the buffer's memory (torch tensor or numpy array)."""
    if isinstance(buffer, np.ndarray):
        return buffer.reshape(-1).view(np.uint8)
    import torch

    assert isinstance(buffer, torch.Tensor)
    return buffer.reshape(-1).view(torch.uint8).numpy()


def copy_buffer(buffer: object) -> object:
    """An independent copy of a torch tensor or numpy array."""
    return buffer.copy() if isinstance(buffer, np.ndarray) else buffer.clone()  # type: ignore[attr-defined]


def page_bytes(buffer: object, geometry: PoolGeometry, page: int) -> bytes:
    """The bytes of one page, in C order of its slice."""
    part = buffer[page_slice(geometry, page)]  # type: ignore[index]
    if isinstance(part, np.ndarray):
        return part.tobytes()
    return raw_bytes(part.contiguous()).tobytes()


def scramble(buffer: object, rng: np.random.Generator) -> None:
    """Overwrite every byte of the buffer with new random bits, in place."""
    view = raw_bytes(buffer)
    view[:] = rng.integers(0, 256, size=view.size, dtype=np.uint8)
