"""The peer protocol's framing and messages: round trips, and nothing but ProtocolError."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kvcr_policy.backends.peer.wire import messages as m
from kvcr_policy.backends.peer.wire.framing import (
    HEADER,
    MAGIC,
    MAX_PAYLOAD,
    VERSION,
    Frame,
    FrameReader,
    pack_frame,
)
from kvcr_policy.backends.peer.wire.message import message
from kvcr_policy.backends.peer.wire.payload import MAX_DESCRIPTORS, MAX_KEYS, Reader, Writer
from kvcr_policy.errors import ProtocolError
from tests.strategies import frames, hostile_frames, messages


def _same(a: m.Message, b: m.Message) -> bool:
    if type(a) is not type(b):
        return False
    for field in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            if not np.array_equal(x, y):
                return False
        elif isinstance(x, m.Message):
            if not _same(x, y):
                return False
        elif x != y:
            return False
    return True


def _frames(data: bytes, chunks: list[int]) -> list[Frame]:
    reader = FrameReader(m.KINDS)
    out, pos = [], 0
    for size in [*chunks, len(data)]:
        out.extend(reader.feed(data[pos : pos + size]))
        pos += size
    return out


@given(messages, st.integers(0, 2**64 - 1))
def test_every_message_round_trips(message: m.Message, request: int) -> None:
    if isinstance(message, m.Error):
        message = m.Error(message.code, message.text[:4000])
    (frame,) = _frames(m.encode(message, request), [])
    assert frame.request == request
    assert _same(m.decode(frame), message)


@given(st.lists(frames(), min_size=1, max_size=5), st.lists(st.integers(0, 64), max_size=8))
def test_frames_survive_any_chunking(encoded: list[bytes], chunks: list[int]) -> None:
    data = b"".join(encoded)
    whole = _frames(data, [])
    assert len(whole) == len(encoded)
    assert _frames(data, chunks) == whole


@settings(max_examples=400)
@given(hostile_frames())
def test_hostile_bytes_raise_only_protocol_errors(data: bytes) -> None:
    reader = FrameReader(m.KINDS)
    try:
        for frame in reader.feed(data):
            m.decode(frame)
    except ProtocolError:
        pass
    assert reader.buffered <= HEADER.size + MAX_PAYLOAD


def test_an_oversize_frame_is_refused_from_its_header_alone() -> None:
    header = HEADER.pack(MAGIC, VERSION, int(m.Kind.EXISTS), MAX_PAYLOAD + 1, 7)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        list(FrameReader(m.KINDS).feed(header))


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (HEADER.pack(b"HT", VERSION, 1, 0, 0), "magic"),
        (HEADER.pack(MAGIC, VERSION + 1, 1, 0, 0), "version"),
        (HEADER.pack(MAGIC, VERSION, 200, 0, 0), "unknown message type"),
    ],
)
def test_foreign_headers_are_refused(header: bytes, match: str) -> None:
    with pytest.raises(ProtocolError, match=match):
        list(FrameReader(m.KINDS).feed(header))


def test_counts_are_capped_before_memory_is_touched() -> None:
    payload = Writer().u32(0).u32(MAX_KEYS + 1).payload()
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        m.decode(Frame(int(m.Kind.EXISTS), 0, payload))
    big = Writer().u32(0).u32(2**32 - 1).payload()  # claims 4 G keys in 8 bytes
    with pytest.raises(ProtocolError):
        m.decode(Frame(int(m.Kind.EXISTS), 0, big))


def test_keys_and_pages_must_pair_up() -> None:
    payload = Writer().u32(0).keys(["a", "b"]).int64s(np.arange(3)).payload()
    with pytest.raises(ProtocolError, match="one page per key"):
        m.decode(Frame(int(m.Kind.CLAIM), 0, payload))


def test_trailing_bytes_and_bad_utf8_are_refused() -> None:
    with pytest.raises(ProtocolError, match="trailing"):
        m.decode(Frame(int(m.Kind.COUNT), 0, Writer().u64(1).u8(0).payload()))
    bad = Writer().u32(0).u32(1).u16(2).payload() + b"\xff\xfe"
    with pytest.raises(ProtocolError, match="UTF-8"):
        m.decode(Frame(int(m.Kind.EXISTS), 0, bad))


def test_non_ascii_keys_round_trip() -> None:
    keys = ["ключ", "", "鍵-1", "a" * 100]
    message = m.decode(_frames(m.encode(m.Exists(3, keys), 1), [])[0])
    assert isinstance(message, m.Exists) and message.keys == keys


def test_reader_never_reads_past_its_payload() -> None:
    r = Reader(b"\x01\x02", "test")
    assert r.u8("a") == 1
    with pytest.raises(ProtocolError, match="truncated"):
        r.u32("b")


def test_pack_frame_refuses_oversize_payloads() -> None:
    with pytest.raises(ValueError, match="MAX_PAYLOAD"):
        pack_frame(1, 0, bytes(MAX_PAYLOAD + 1))


def test_descriptor_lists_pair_up_and_are_capped() -> None:
    unpaired = Writer().u64(1).u64(0).int64s(np.arange(3)).int64s(np.ones(2)).payload()
    with pytest.raises(ProtocolError, match="one of each per descriptor"):
        m.decode(Frame(int(m.Kind.SEND), 0, unpaired))
    too_many = Writer().u64(1).u32(MAX_DESCRIPTORS + 1).payload()
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        m.decode(Frame(int(m.Kind.POST), 0, too_many))


def test_every_field_is_declared_with_its_codec_once() -> None:
    assert [name for name, _ in m.Send.FIELDS] == ["claim", "tag_base", "offsets", "lengths"]
    assert m.Delete.FIELDS == m.Exists.FIELDS and m.Delete.KIND == m.Kind.DELETE
    with pytest.raises(TypeError, match="annotate the field with a codec"):

        @message(m.Kind.PONG)
        class Bare(m.Message):
            value: int


@given(
    st.lists(frames(), min_size=2, max_size=5),
    st.integers(0, 4),
    st.lists(st.integers(1, 64), max_size=8),
)
def test_a_discarded_frame_leaves_the_stream_in_step(
    encoded: list[bytes], which: int, chunks: list[int]
) -> None:
    """A frame the server refuses (no budget) is dropped as it arrives; the frames after it
    decode as if it had never been sent."""
    which %= len(encoded)
    assume(len(encoded[which]) > HEADER.size)  # a frame with a payload still to come
    data = b"".join(encoded)
    every = _frames(data, [])
    reader = FrameReader(m.KINDS)
    header_end = sum(map(len, encoded[:which])) + HEADER.size
    out = list(reader.feed(data[:header_end]))
    assert len(out) == which and reader.expecting == len(encoded[which]) - HEADER.size
    _, request, length = reader.discard()
    assert (request, length) == (every[which].request, len(every[which].payload))
    pos = header_end
    for size in [*chunks, len(data)]:
        out.extend(reader.feed(data[pos : pos + size]))
        pos += size
    assert out == every[:which] + every[which + 1 :]
    assert not reader.partial
