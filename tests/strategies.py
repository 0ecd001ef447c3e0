"""Hypothesis strategies shared by the test suite (one place, as attrs does).

Sizes are kept tiny so that properties can expand descriptors into per-byte maps and compare
whole buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import get_args, get_origin

import numpy as np
from hypothesis import strategies as st

from kvcr_policy.descriptors import Descriptors
from kvcr_policy.geometry import LAYOUTS, MLA_LAYOUTS, PoolGeometry
from kvcr_policy.sources import known_leaves

__all__ = [
    "PageTransfer",
    "descriptors",
    "geometries",
    "page_lists",
    "page_transfers",
]

# dtypes numpy can hold, so test buffers can be plain numpy arrays.
NUMPY_DTYPES = ("float32", "float16", "uint8")


@st.composite
def geometries(
    draw: st.DrawFn,
    *,
    max_pages: int = 6,
    mla: bool | None = None,
    name: str = "kv",
) -> PoolGeometry:
    """A small valid geometry of any layout, MHA or MLA (``mla`` fixes which)."""
    is_mla = draw(st.booleans()) if mla is None else mla
    layout = draw(st.sampled_from(MLA_LAYOUTS if is_mla else LAYOUTS))
    page_size = draw(st.integers(1, 4))
    return PoolGeometry(
        name=name,
        layout=layout,
        layers=draw(st.integers(1, 4)),
        heads=1 if is_mla else draw(st.integers(1, 3)),
        head_dim=draw(st.integers(1, 4)),
        dtype=draw(st.sampled_from(NUMPY_DTYPES)),
        page_size=page_size,
        tokens=page_size * draw(st.integers(1, max_pages)),
        mla=is_mla,
    )


def page_lists(pages: int, *, size: int | None = None) -> st.SearchStrategy[list[int]]:
    """Distinct page numbers below ``pages``: either a contiguous run or any permutation."""
    n = st.integers(0, pages) if size is None else st.just(size)

    @st.composite
    def run(draw: st.DrawFn) -> list[int]:
        length = draw(n)
        start = draw(st.integers(0, pages - length))
        return list(range(start, start + length))

    @st.composite
    def scattered(draw: st.DrawFn) -> list[int]:
        length = draw(n)
        return draw(st.permutations(range(pages)))[:length]

    return st.one_of(run(), scattered())


@dataclass(frozen=True, slots=True)
class PageTransfer:
    """A copy of ``src_pages[i]`` of the pool to ``dst_pages[i]`` of a tier mirroring it."""

    src: PoolGeometry
    src_pages: list[int]
    dst: PoolGeometry
    dst_pages: list[int]


@st.composite
def page_transfers(draw: st.DrawFn, *, mla: bool | None = None) -> PageTransfer:
    """A pool, a tier with its layout and its own page count, and distinct pages on each side."""
    src = draw(geometries(mla=mla))
    dst = replace(src, name="tier", tokens=src.page_size * draw(st.integers(1, 6)))
    src_pages = draw(page_lists(src.pages))
    n = min(len(src_pages), dst.pages)
    dst_pages = draw(page_lists(dst.pages, size=n))
    return PageTransfer(src=src, src_pages=src_pages[:n], dst=dst, dst_pages=dst_pages)


@st.composite
def descriptors(draw: st.DrawFn, *, max_size: int = 24, max_length: int = 9) -> Descriptors:
    """Descriptors with disjoint, increasing src and dst ranges and runs worth coalescing.

    Each step either continues the previous range on both sides (mergeable), leaves a gap on
    one or both sides, or starts a new bound while staying contiguous (must not merge).
    """
    steps = draw(
        st.lists(
            st.tuples(
                st.integers(0, max_length),
                st.sampled_from(("join", "join", "src_gap", "dst_gap", "both_gap", "bound")),
                st.integers(1, 5),
            ),
            max_size=max_size,
        )
    )
    src, dst, length, bound = [], [], [], []
    at_src = draw(st.integers(0, 7))
    at_dst = draw(st.integers(0, 7))
    current = 0
    for size, kind, gap in steps:
        at_src += gap if kind in ("src_gap", "both_gap") else 0
        at_dst += gap if kind in ("dst_gap", "both_gap") else 0
        current += kind == "bound"
        src.append(at_src)
        dst.append(at_dst)
        length.append(size)
        bound.append(current)
        at_src += size
        at_dst += size
    return Descriptors.from_arrays(src, dst, length, bound=np.asarray(bound, dtype=np.int64))


# --- Configuration: valid leaf values of PolicyConfig and their KVCR_POLICY_* spellings ---

_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)

# Leaves whose validity depends on another leaf: kept or dropped together.
_TIED = (
    ("batching.window_pages", "batching.read_batch_pages"),
    ("placement.numa_policy", "placement.numa_nodes"),
    ("placement.numa_nodes", "placement.numa_policy"),
)


@st.composite
def config_leaves(draw: st.DrawFn) -> dict[str, object]:
    """Valid values for a random subset of PolicyConfig's leaves, keyed by dotted path.

    Strategy names are built-in ones; cross-field rules hold (``window_pages`` at least
    ``read_batch_pages``, NUMA nodes matching the policy) whichever leaves are kept.
    """
    read = draw(st.integers(1, 4096))
    policy = draw(st.sampled_from(("none", "preferred", "bind", "interleave")))
    if policy == "none":
        nodes: tuple[int, ...] = ()
    elif policy == "preferred":
        nodes = (draw(st.integers(0, 7)),)
    else:
        nodes = tuple(draw(st.lists(st.integers(0, 7), min_size=1, max_size=3, unique=True)))
    sizes = st.integers(1, 1 << 40)
    leaves: dict[str, object] = {
        "batching.read_batch_pages": read,
        "batching.query_batch_keys": draw(st.integers(1, 4096)),
        "batching.window_batches": draw(st.none() | st.integers(1, 64)),
        "batching.window_pages": draw(st.none() | st.integers(read, 1 << 20)),
        "batching.window_bytes": draw(st.none() | sizes),
        "coalescing.strategy": draw(st.sampled_from(("none", "contiguous"))),
        "coalescing.split_bytes": draw(st.none() | sizes),
        "coalescing.on_unsupported": draw(st.sampled_from(("fallback", "error"))),
        "placement.capacity_bytes": draw(sizes),
        "placement.prefault": draw(st.booleans()),
        "placement.huge_pages": draw(st.sampled_from(("off", "prefer", "require"))),
        "placement.numa_policy": policy,
        "placement.numa_nodes": nodes,
        "placement.numa_mode": draw(st.sampled_from(("prefer", "require"))),
        "placement.eviction": draw(st.sampled_from(("lru", "fifo"))),
        "thread_tuning.switch_interval_s": draw(
            st.none() | st.floats(1e-6, 1.0, allow_nan=False, allow_infinity=False)
        ),
        "fallback.strategy": draw(st.sampled_from(("sparse", "miss"))),
        "fallback.max_retries": draw(st.integers(0, 5)),
        "transport.threads": draw(st.integers(0, 64)),
        "transport.op_timeout_s": draw(st.floats(1e-3, 1e4, allow_nan=False)),
        "plugins.strict": draw(st.booleans()),
        "plugins.allow": draw(st.none() | st.lists(_NAMES, max_size=3).map(tuple)),
        "plugins.block": tuple(draw(st.lists(_NAMES, max_size=3))),
    }
    keep = set(draw(st.sets(st.sampled_from(sorted(leaves)))))
    for leaf, partner in _TIED:
        if leaf in keep:
            keep.add(partner)
    return {path: value for path, value in leaves.items() if path in keep}


#: Config leaves whose type is a list or tuple (optional or not).
_LIST_LEAVES = frozenset(
    path
    for path, annotation in known_leaves().items()
    if {get_origin(a) or a for a in (annotation, *get_args(annotation))} & {list, tuple}
)


def env_text(path: str, value: object) -> st.SearchStrategy[str]:
    """The ways a ``KVCR_POLICY_*`` variable may spell ``value`` of the leaf at ``path``."""
    if value is None:
        # An empty variable is an empty list for a list field (KVCR_POLICY_PLUGINS=), else None.
        empty = () if path in _LIST_LEAVES else ("",)
        return st.sampled_from(("none", "null", "None", " NULL ", *empty))
    if isinstance(value, bool):
        return st.sampled_from(("true", "1", "yes", "True") if value else ("false", "0", "no"))
    if isinstance(value, int):
        spellings = [str(value), f" {value} "]
        if path.endswith("_bytes") and value % 1024 == 0:
            spellings.append(f"{value // 1024}KiB")
        return st.sampled_from(spellings)
    if isinstance(value, float):
        return st.just(repr(value))
    if isinstance(value, (list, tuple)):
        as_json = "[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]"
        if not value:
            # An empty list must be spelled as JSON: an empty variable means None where allowed.
            return st.just(as_json)
        return st.sampled_from((as_json, ",".join(str(v) for v in value)))
    return st.just(str(value))


# --- Pool buffers for pipeline tests ---
#
# A page is addressed here by the meaning of the buffer's axes (a token axis or a page axis, as
# SGLang allocates them), never by byte offsets, so a test built on these helpers checks the
# descriptor arithmetic instead of repeating it.

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


@st.composite
def distinct_pages(
    draw: st.DrawFn, pages: int, *, min_size: int = 1, max_size: int | None = None
) -> list[int]:
    """Distinct page numbers below ``pages``, in random order (a host pool's free pages)."""
    upper = pages if max_size is None else min(max_size, pages)
    size = draw(st.integers(min_size, upper))
    return draw(st.permutations(range(pages)))[:size]
