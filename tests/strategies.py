"""The test suite's Hypothesis strategies, all of them (one place, as attrs does).

A state machine's own rules and the strategies they draw from stay with the machine.

Sizes are kept tiny so that properties can expand descriptors into per-byte maps and compare
whole buffers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any, get_args, get_origin

import numpy as np
from hypothesis import strategies as st

from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.backends.peer.wire.framing import HEADER, MAGIC, VERSION
from kvcr_policy.config.sources import known_leaves
from kvcr_policy.descriptors import Descriptors
from kvcr_policy.geometry import LAYOUTS, MLA_LAYOUTS, PoolGeometry
from kvcr_policy.integrations.sglang.prefix import ALL_PAGES, TRAILING_PAGES
from kvcr_policy.memory.headroom import Headroom, Limit

__all__ = [
    "ClaimScenario",
    "PageTransfer",
    "claim_scenarios",
    "config_leaves",
    "copies",
    "descriptors",
    "distinct_pages",
    "env_text",
    "eviction_ops",
    "frames",
    "fuzz_requests",
    "geometries",
    "hostile_frames",
    "memory_limits",
    "messages",
    "page_lists",
    "page_transfers",
    "prefix_queries",
    "rates",
    "repeating_transfers",
    "reshaped",
    "scalars",
    "tier_slots",
    "trace_requests",
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
        # An empty variable is an empty list for a list field (KVCR_POLICY_PLUGINS=); it
        # never unsets an optional value (refused: only none, null unset it).
        return st.sampled_from(("none", "null", "None", " NULL "))
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


@st.composite
def distinct_pages(
    draw: st.DrawFn, pages: int, *, min_size: int = 1, max_size: int | None = None
) -> list[int]:
    """Distinct page numbers below ``pages``, in random order (a host pool's free pages)."""
    upper = pages if max_size is None else min(max_size, pages)
    size = draw(st.integers(min_size, upper))
    return draw(st.permutations(range(pages)))[:size]


@st.composite
def repeating_transfers(draw: st.DrawFn) -> PageTransfer:
    """A pool and a tier, with pages that may repeat on either side (a key read twice)."""
    src = draw(geometries(max_pages=4))
    dst = replace(src, name="tier", tokens=src.page_size * draw(st.integers(1, 4)))
    n = draw(st.integers(0, 4))
    pick = lambda pages: st.lists(st.integers(0, pages - 1), min_size=n, max_size=n)  # noqa: E731
    return PageTransfer(src, draw(pick(src.pages)), dst, draw(pick(dst.pages)))


def tier_slots(geo: PoolGeometry, *, repeats: bool) -> st.SearchStrategy[list[int]]:
    """Slots a server claimed (a read may name a slot twice) or reserved (distinct)."""
    if repeats:
        return st.lists(st.integers(0, geo.pages - 1), min_size=1, max_size=6)
    return page_lists(geo.pages).filter(bool)


@st.composite
def copies(draw: st.DrawFn, size: int) -> tuple[list[int], list[int], list[int]]:
    """Copies within ``size`` bytes at odd offsets and lengths, none writing a byte another one
    writes: (sources, destinations, lengths)."""
    n = draw(st.integers(0, 12))
    lengths = draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
    src = [draw(st.integers(0, size - length)) for length in lengths]
    dst, cursor = [], 0
    for length in lengths:  # destinations disjoint and in order, gaps of odd sizes
        cursor += draw(st.integers(0, 97))
        if cursor + length > size:
            break
        dst.append(cursor)
        cursor += length
    k = len(dst)
    return src[:k], dst, lengths[:k]


# --- Tunables and benchmark verdicts ---

#: Values a tunable's choices may hold.
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))

#: Measured rates (GiB/s) of a benchmark order.
rates = st.floats(1.0, 100.0, allow_nan=False)


# --- SGLang's prefix query (kvcr_policy.integrations.sglang.prefix) ---


@st.composite
def prefix_queries(
    draw: st.DrawFn,
) -> tuple[int, list[tuple[str, str, int]], dict[str, list[bool]]]:
    """KV pages, the other pools (name, policy, trailing keys), and which pages each holds."""
    kv_pages = draw(st.integers(0, 12))
    count = draw(st.integers(0, 3))
    pools = [
        (f"p{i}", draw(st.sampled_from([ALL_PAGES, TRAILING_PAGES])), draw(st.integers(0, 5)))
        for i in range(count)
    ]
    held = {name: draw(st.lists(st.booleans(), min_size=kv_pages, max_size=kv_pages))
            for name, _, _ in pools}  # fmt: skip
    return kv_pages, pools, held


# --- Pool memory (kvcr_policy.integrations.sglang.memory) ---


@st.composite
def memory_pieces(
    draw: st.DrawFn,
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Byte ranges ``(start, end)`` a pool owns (overlapping or touching at times), and pieces
    ``(address, size)`` to check against them, many near the ranges' edges."""
    ranges = draw(
        st.lists(
            st.tuples(st.integers(0, 200), st.integers(0, 60)).map(lambda r: (r[0], r[0] + r[1])),
            max_size=5,
        )
    )
    edges = [e for start, end in ranges for e in (start, end)] or [0]
    address = st.one_of(
        st.integers(0, 270), st.sampled_from(edges).flatmap(lambda e: st.integers(e - 2, e + 2))
    )
    pieces = draw(st.lists(st.tuples(address.map(lambda a: max(a, 0)), st.integers(1, 70))))
    return ranges, pieces


# --- The peer protocol (kvcr_policy.backends.peer.wire) ---

_u8 = st.integers(0, 255)
_u16 = st.integers(0, 2**16 - 1)
_u32 = st.integers(0, 2**32 - 1)
_u64 = st.integers(0, 2**64 - 1)
_text = st.text(max_size=40)
_keys = st.lists(st.text(max_size=24), max_size=12)
_int64s = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=12).map(
    lambda v: np.asarray(v, dtype=np.int64)
)
_flags = st.lists(st.booleans(), max_size=12).map(lambda v: np.asarray(v, dtype=bool))


@st.composite
def _keys_pages(draw: st.DrawFn, cls: type) -> m.Message:
    ks = draw(_keys)
    pages = np.asarray(
        draw(st.lists(st.integers(0, 2**40), min_size=len(ks), max_size=len(ks))), dtype=np.int64
    )
    if cls is m.Reserve:
        return cls(draw(_u32), ks, pages, draw(_u64), draw(_keys))
    return cls(draw(_u32), ks, pages)


@st.composite
def _ranges(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(0, 12))
    values = st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n)
    return np.asarray(draw(values), dtype=np.int64), np.asarray(draw(values), dtype=np.int64)


def _shaped(cls: type, *head: st.SearchStrategy[int]) -> st.SearchStrategy[m.Message]:
    return st.tuples(*head, _ranges()).map(lambda t: cls(*t[:-1], *t[-1]))


messages: st.SearchStrategy[m.Message] = st.one_of(
    st.builds(
        m.Hello,
        _u32,
        st.integers(0, 3),
        _u32,
        _u32,
        _text,
        _text,
        st.sampled_from([b"", b"k" * 16]),
        st.binary(min_size=32, max_size=32),
    ),
    st.builds(
        m.Challenge,
        st.just(False),
        st.binary(min_size=32, max_size=32),
        st.binary(min_size=32, max_size=32),
    ),
    st.builds(m.Challenge, st.just(True), st.binary(min_size=32, max_size=32), st.just(b"")),
    st.builds(m.Auth, st.sampled_from([b"", b"p" * 32]), st.binary(max_size=64)),
    st.builds(
        m.Welcome, _u32, st.integers(1, 3), _u64, _text, st.binary(max_size=64), _text, _text
    ),
    st.builds(m.Error, _u16, _text),
    st.builds(
        m.Attach,
        _text,
        st.sampled_from(LAYOUTS),
        _u32,
        _u32,
        _u32,
        st.text(max_size=8),
        _u32,
        _u64,
        st.booleans(),
        st.integers(0, m.ALIGN_BYTES - 1),
    ),
    st.builds(m.Attached, _u32, _u64, _u64, _u64),
    st.builds(m.Exists, _u32, _keys),
    st.builds(m.Delete, _u32, _keys),
    st.builds(m.Clear, _u32),
    st.builds(m.Stats, _u32),
    st.builds(m.Count, _u64),
    _keys_pages(m.Claim),
    _keys_pages(m.Reserve),
    st.builds(m.Claimed, _u64, _int64s),
    _shaped(m.Send, _u64, _u64),
    st.builds(m.Reserved, _u64, _int64s),
    _shaped(m.Post, _u64),
    st.builds(m.Posted, _u64, _u64),
    st.builds(m.Commit, _u64, _flags),
    st.builds(m.Written, _u64, _flags),
    st.builds(m.Sent, _u64, st.booleans()),
    st.builds(m.Release, _u64),
    st.builds(m.Copied, _u64),
    st.builds(m.StatsReply, _text),
    st.builds(m.Probe, _u32, _u64, _u64),
    st.just(m.Ping()),
    st.just(m.Pong()),
)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """A well-formed frame of any message."""
    return m.encode(draw(messages), draw(_u64))


@st.composite
def hostile_frames(draw: st.DrawFn) -> bytes:
    """Bytes a hostile or broken peer might send: valid frames cut, spliced, resized, or noise."""
    kind = draw(st.sampled_from(("noise", "truncated", "mutated", "length", "payload", "header")))
    good = draw(frames())
    if kind == "noise":
        return draw(st.binary(min_size=1, max_size=200))
    if kind == "truncated":
        return good[: draw(st.integers(0, max(0, len(good) - 1)))]
    if kind == "mutated":
        data = bytearray(good)
        for _ in range(draw(st.integers(1, 4))):
            data[draw(st.integers(0, len(data) - 1))] = draw(_u8)
        return bytes(data)
    if kind == "length":  # a header whose length lies, small or huge
        payload = good[HEADER.size :]
        length = draw(st.one_of(_u32, st.integers(0, len(payload) + 8)))
        return HEADER.pack(MAGIC, VERSION, good[3], length, 0) + payload
    if kind == "header":
        return HEADER.pack(
            draw(st.binary(min_size=2, max_size=2)), draw(_u8), draw(_u8), draw(_u32), draw(_u64)
        )
    body = draw(st.binary(max_size=120))
    return HEADER.pack(MAGIC, VERSION, draw(st.sampled_from(sorted(m.KINDS))), len(body), 0) + body


@st.composite
def reshaped(draw: st.DrawFn, d: Descriptors, *, by_src: bool = False) -> Descriptors:
    """``d`` cut at random points, then random runs merged, then shuffled: any valid shaping.

    Pieces merge only where contiguous on both sides; ``by_src`` sorts them by ``src`` first,
    so pieces adjacent in source memory (across fragments and pages) get the chance.
    """
    pieces: list[list[int]] = []
    for src, dst, length, page, end in zip(
        d.src.tolist(),
        d.dst.tolist(),
        d.length.tolist(),
        d.page.tolist(),
        d.page_end.tolist(),
        strict=True,
    ):
        cuts = draw(st.lists(st.integers(1, length - 1), max_size=2)) if length > 1 else []
        bounds = [0, *sorted(set(cuts)), length]
        for a, b in itertools.pairwise(bounds):
            pieces.append([src + a, dst + a, b - a, page, end])
    if by_src:
        pieces.sort()
    merged: list[list[int]] = []
    for piece in pieces:
        last = merged[-1] if merged else None
        if (
            last is not None
            and last[0] + last[2] == piece[0]
            and last[1] + last[2] == piece[1]
            and draw(st.booleans())
        ):
            last[2] += piece[2]
            last[3], last[4] = min(last[3], piece[3]), max(last[4], piece[4])
        else:
            merged.append(list(piece))
    order = draw(st.permutations(range(len(merged))))
    rows = np.asarray([merged[i] for i in order], dtype=np.int64).reshape(-1, 5)
    return Descriptors.from_arrays(
        rows[:, 0], rows[:, 1], rows[:, 2], page=rows[:, 3], page_end=rows[:, 4]
    )


@dataclass(frozen=True)
class ClaimScenario:
    """A store's history around one claim: keys ``stored`` one write each (in order, evicting
    as needed), claims ``held`` before it, the claim's keys (repeats allowed), keys deleted and
    written while it is held, then its release."""

    capacity: int
    policy: str
    stored: list[str]
    held: list[list[str]]
    claimed: list[str]
    deleted: list[str]
    rewritten: list[str]


@st.composite
def claim_scenarios(draw: st.DrawFn) -> ClaimScenario:
    """Histories around one claim of a small store (:class:`ClaimScenario`)."""
    key = st.sampled_from([f"k{i}" for i in range(12)])
    return ClaimScenario(
        capacity=draw(st.integers(1, 10)),
        policy=draw(st.sampled_from(("lru", "fifo"))),
        stored=draw(st.lists(key, max_size=20)),
        held=draw(st.lists(st.lists(key, max_size=6), max_size=3)),
        claimed=draw(st.lists(key, max_size=14)),
        deleted=draw(st.lists(key, max_size=5)),
        rewritten=draw(st.lists(key, max_size=5)),
    )


@st.composite
def eviction_ops(draw: st.DrawFn) -> list[tuple[str, int, int]]:
    """Calls an eviction policy may get from a store: ``(op, a, b)`` with op one of admit,
    touch, forget (``a`` picks a held slot, as an index into them), and victims (``a`` the
    count, ``b`` a bit mask of which held slots are evictable)."""
    op = st.sampled_from(("admit", "admit", "touch", "touch", "forget", "victims"))
    return draw(
        st.lists(
            st.tuples(op, st.integers(0, 40), st.integers(0, (1 << 16) - 1)),
            max_size=120,
        )
    )


@st.composite
def trace_requests(draw: st.DrawFn, *, max_requests: int = 40) -> list[dict[str, object]]:
    """Requests in Mooncake's trace format over a few shared prefixes: chains of block ids
    that branch (as conversations and shared system prompts do), sometimes a repeated id
    within a request, input lengths that end inside the last block (512-token blocks)."""
    count = draw(st.integers(1, max_requests))
    chains: list[list[int]] = [[0]]
    fresh = itertools.count(1)
    requests: list[dict[str, object]] = []
    timestamp = 0
    for _ in range(count):
        base = draw(st.sampled_from(chains))
        keep = draw(st.integers(0, len(base)))
        grown = base[:keep] + [next(fresh) for _ in range(draw(st.integers(0, 6)))]
        if grown and draw(st.integers(0, 9)) == 0:
            grown.append(grown[0])  # a repeated id within one request
        if not grown:
            grown = [next(fresh)]
        chains.append(grown)
        timestamp += draw(st.integers(0, 3000))
        tail = draw(st.integers(1, 512))
        requests.append(
            {
                "timestamp": timestamp,
                "input_length": 512 * (len(grown) - 1) + tail,
                "output_length": draw(st.integers(0, 100)),
                "hash_ids": grown,
            }
        )
    return requests


# --- The peer protocol, fuzzed over an authenticated session (test_peer_fuzz.py) ---

#: Integers at and past the edges of a field's range, mixed with any value of it.
_U32_EDGES = (0, 1, 2, 3, 63, 64, 65, 255, 4096, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1)
_U64_EDGES = (*_U32_EDGES, 2**32, 2**48, 2**62, 2**63 - 1, 2**63, 2**64 - 1)
_I64_EDGES = (-(2**63), -(2**31), -1, 0, 1, 2**31, 2**40, 2**62, 2**63 - 1)
_any_u32 = st.one_of(st.sampled_from(_U32_EDGES), _u32)
_any_u64 = st.one_of(st.sampled_from(_U64_EDGES), _u64)
_odd_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["", "\x00", "a\x00b", "team-b/kv", "\n", '"', "kv"]),
    st.integers(200, 400).map(lambda n: "n" * n),  # past a name's 256 bytes
    st.text(alphabet="\u4e00\U0001f600", max_size=100),
)


@st.composite
def _fuzz_keys(draw: st.DrawFn) -> list[str]:
    """Keys of every size the wire takes (1,024 UTF-8 bytes) and counts past MAX_KEYS."""
    kind = draw(st.sampled_from(("few", "long", "many")))
    if kind == "many":  # up to past MAX_KEYS (65,536): refused from the count alone
        return ["k"] * draw(st.sampled_from([0, 1, 1024, 65536, 65537, 70000]))
    if kind == "long":
        return [draw(st.sampled_from(["x" * 1024, "\u4e00" * 341, "\U0001f600" * 256, "y"]))]
    return draw(st.lists(st.one_of(_odd_text, st.text(max_size=8)), max_size=8))


@st.composite
def _fuzz_int64s(draw: st.DrawFn, size: int | None = None) -> np.ndarray:
    n = size if size is not None else draw(st.sampled_from([0, 1, 2, 7, 1000]))
    value = st.one_of(st.sampled_from(_I64_EDGES), st.integers(-(2**63), 2**63 - 1))
    if n > 16:  # a long array of one drawn value: large counts stay cheap to draw
        return np.full(n, draw(value), dtype=np.int64)
    return np.asarray(draw(st.lists(value, min_size=n, max_size=n)), dtype=np.int64)


@st.composite
def fuzz_requests(draw: st.DrawFn) -> m.Message:
    """Any message a client could send on an authenticated session, its fields drawn across
    their whole ranges and past what the server accepts: pool numbers and handles a session
    holds (small ones: a server numbers them from 0 and 1) as often as made-up ones, every
    server-only message too. Nothing depends on what the server answered, so Hypothesis can
    replay and shrink a sequence."""
    pool = draw(st.one_of(st.integers(0, 3), _any_u32))
    handle = draw(st.one_of(st.integers(0, 8), _any_u64))
    kind = draw(st.sampled_from(sorted(m.KINDS)))
    cls = m.Kind(kind)
    keys = draw(_fuzz_keys())
    if cls is m.Kind.ATTACH:
        small = st.one_of(st.integers(1, 8), _any_u32)
        return m.Attach(
            draw(_odd_text),
            draw(st.one_of(st.sampled_from(LAYOUTS), st.text(max_size=40))),
            draw(small),
            draw(small),
            draw(st.one_of(st.integers(1, 64), _any_u32)),
            draw(st.one_of(st.sampled_from(["float16", "bfloat16", "float8_e4m3fn"]), _odd_text)),
            draw(small),
            draw(st.one_of(st.integers(0, 4096), _any_u64)),
            draw(st.booleans()),
            draw(st.one_of(st.integers(0, m.ALIGN_BYTES - 1), _any_u32)),
        )
    if cls in (m.Kind.EXISTS, m.Kind.DELETE):
        return (m.Exists if cls is m.Kind.EXISTS else m.Delete)(pool, keys)
    if cls in (m.Kind.CLEAR, m.Kind.STATS):
        return (m.Clear if cls is m.Kind.CLEAR else m.Stats)(pool)
    if cls in (m.Kind.CLAIM, m.Kind.RESERVE):
        keep: tuple[Any, ...] = ()
        if cls is m.Kind.RESERVE:  # a call (any number, 0 none) and its other keys, hostile too
            keep = (
                draw(st.sampled_from([0, 1, 2, 2**64 - 1])),
                draw(st.one_of(st.lists(st.text("ab-09", max_size=9), max_size=6), _fuzz_keys())),
            )
        message = m.Claim if cls is m.Kind.CLAIM else m.Reserve
        if draw(st.booleans()):  # plausible: a few keys and pages of the attached pool (8)
            few = draw(st.lists(st.text("ab-09", min_size=1, max_size=9), min_size=1, max_size=6))
            pages = st.lists(st.integers(0, 7), min_size=len(few), max_size=len(few))
            return message(0, few, np.asarray(draw(pages), dtype=np.int64), *keep)
        size = draw(st.sampled_from([len(keys), len(keys), len(keys) + 1]))  # may not pair up
        return message(pool, keys, draw(_fuzz_int64s(min(size, 70000))), *keep)
    if cls in (m.Kind.SEND, m.Kind.POST):
        n = draw(st.sampled_from([0, 1, 2, 5, 1000]))
        if draw(st.booleans()):  # plausible: within a tier of a few 1,536-byte pages
            near = st.lists(st.integers(-1, 1 << 14), min_size=min(n, 5), max_size=min(n, 5))
            offsets, lengths = (np.asarray(draw(near), dtype=np.int64) for _ in range(2))
        else:
            offsets, lengths = (
                draw(_fuzz_int64s(n)),
                draw(_fuzz_int64s(draw(st.sampled_from([n, n + 1])))),
            )
        if cls is m.Kind.SEND:
            return m.Send(handle, draw(_any_u64), offsets, lengths)
        return m.Post(handle, offsets, lengths)
    if cls in (m.Kind.COMMIT, m.Kind.WRITTEN):
        flags = np.asarray(draw(st.lists(st.booleans(), max_size=10)), dtype=bool)
        return (m.Commit if cls is m.Kind.COMMIT else m.Written)(handle, flags)
    if cls is m.Kind.RELEASE:
        return m.Release(handle)
    if cls is m.Kind.PROBE:
        return m.Probe(pool, draw(_any_u64), draw(st.one_of(st.integers(0, 1 << 20), _any_u64)))
    if cls in (m.Kind.PING, m.Kind.PONG):
        return m.Ping() if cls is m.Kind.PING else m.Pong()
    # Server-only messages, HELLO and AUTH again, answers: a client never sends them.
    return draw(messages.filter(lambda msg: msg.KIND is cls))


@st.composite
def scattered_slots(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(host, device, length)`` of a ``layer_first`` restore from tier slots in any order.

    Each page is one slot on the host (its fragments end to end) and one fragment per layer
    in the pool (layer ``l`` of page ``p`` at ``(l * pages + p) * fragment``); some fragments
    may be left out, as a partial page would be.
    """
    pages = draw(st.integers(1, 9))
    layers = draw(st.integers(1, 5))
    fragment = draw(st.sampled_from((8, 24, 72, 128, 4096)))
    slots = draw(st.permutations(range(pages)))
    keep = draw(st.lists(st.booleans(), min_size=pages * layers, max_size=pages * layers))
    host, device = [], []
    for p in range(pages):
        for layer in range(layers):
            if keep[p * layers + layer] or p == layer == 0:
                host.append((slots[p] * layers + layer) * fragment)
                device.append((layer * pages + p) * fragment)
    length = np.full(len(host), fragment, dtype=np.int64)
    return np.asarray(host, dtype=np.int64), np.asarray(device, dtype=np.int64), length


@st.composite
def _limit(draw: st.DrawFn) -> Limit:
    total = draw(st.integers(0, 1 << 44))
    in_use = draw(st.integers(0, 1 << 44))  # may exceed total: a cgroup over its limit
    scope = draw(st.sampled_from(["cgroup", "host", "process"]))
    shared = draw(st.booleans()) if scope == "cgroup" else scope == "host"
    return Limit(name=f"{scope} limit", source="/fake", scope=scope, total_name="total",
                 total=total, in_use=in_use, available=total - in_use, shared=shared,
                 fix="raise it")  # fmt: skip


def memory_limits() -> st.SearchStrategy[Headroom]:
    """A :class:`Headroom` of one to six limits of any scope, over their limit or not."""
    return st.lists(_limit(), min_size=1, max_size=6).map(lambda found: Headroom(tuple(found)))
