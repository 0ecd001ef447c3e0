"""Hypothesis strategies for the peer protocol (kept beside the peer tests they serve)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import strategies as st

from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.backends.peer.wire.framing import HEADER, MAGIC, VERSION
from kvcr_policy.descriptors import Descriptors
from kvcr_policy.geometry import LAYOUTS

__all__ = ["frames", "hostile_frames", "messages", "reshaped"]

u8 = st.integers(0, 255)
u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
text = st.text(max_size=40)
keys = st.lists(st.text(max_size=24), max_size=12)
int64s = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=12).map(
    lambda v: np.asarray(v, dtype=np.int64)
)
flags = st.lists(st.booleans(), max_size=12).map(lambda v: np.asarray(v, dtype=bool))


@st.composite
def _keys_pages(draw: st.DrawFn, cls: type) -> m.Message:
    ks = draw(keys)
    pages = np.asarray(
        draw(st.lists(st.integers(0, 2**40), min_size=len(ks), max_size=len(ks))), dtype=np.int64
    )
    return cls(draw(u32), ks, pages)


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
        u32,
        st.integers(0, 2),
        u32,
        u32,
        text,
        text,
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
    st.builds(m.Welcome, u32, st.integers(1, 2), u64, text, st.binary(max_size=64), text),
    st.builds(m.Error, u16, text),
    st.builds(
        m.Attach,
        text,
        st.sampled_from(LAYOUTS),
        u32,
        u32,
        u32,
        st.text(max_size=8),
        u32,
        u64,
        st.booleans(),
        st.integers(0, m.ALIGN_BYTES - 1),
    ),
    st.builds(m.Attached, u32, u64),
    st.builds(m.Exists, u32, keys),
    st.builds(m.Delete, u32, keys),
    st.builds(m.Clear, u32),
    st.builds(m.Stats, u32),
    st.builds(m.Count, u64),
    _keys_pages(m.Claim),
    _keys_pages(m.Reserve),
    st.builds(m.Claimed, u64, int64s),
    _shaped(m.Send, u64, u64),
    st.builds(m.Reserved, u64, int64s),
    _shaped(m.Post, u64),
    st.builds(m.Posted, u64, u64),
    st.builds(m.Commit, u64, flags),
    st.builds(m.Written, u64, flags),
    st.builds(m.Sent, u64, st.booleans()),
    st.builds(m.Release, u64),
    st.builds(m.StatsReply, text),
    st.builds(m.Probe, u32, u64, u64),
    st.just(m.Ping()),
    st.just(m.Pong()),
)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """A well-formed frame of any message."""
    return m.encode(draw(messages), draw(u64))


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
            data[draw(st.integers(0, len(data) - 1))] = draw(u8)
        return bytes(data)
    if kind == "length":  # a header whose length lies, small or huge
        payload = good[HEADER.size :]
        length = draw(st.one_of(u32, st.integers(0, len(payload) + 8)))
        return HEADER.pack(MAGIC, VERSION, good[3], length, 0) + payload
    if kind == "header":
        return HEADER.pack(
            draw(st.binary(min_size=2, max_size=2)), draw(u8), draw(u8), draw(u32), draw(u64)
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
