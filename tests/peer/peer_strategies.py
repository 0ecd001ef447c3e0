"""Hypothesis strategies for the peer protocol (kept beside the peer tests they serve)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from kvcr_policy.backends.peer import messages as m
from kvcr_policy.backends.peer.protocol import HEADER, MAGIC, VERSION
from kvcr_policy.geometry import LAYOUTS

__all__ = ["frames", "hostile_frames", "messages"]

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


def _plan(cls: type) -> st.SearchStrategy[m.Message]:
    return st.builds(cls, u64, u64, u32, u64, u32)


messages: st.SearchStrategy[m.Message] = st.one_of(
    st.builds(m.Hello, u32, st.integers(0, 2), u32, u32, text, st.binary(max_size=64), text),
    st.builds(m.Welcome, u32, st.integers(1, 2), u64, text, st.binary(max_size=64)),
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
        st.booleans(),
        u64,
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
    _plan(m.Send),
    st.builds(m.Reserved, u64, int64s, _plan(m.Plan)),
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
