"""The peer control protocol's framing: a fixed header, bounded payloads, checked readers.

Every frame is a 16-byte little-endian header followed by ``length`` payload bytes::

    offset  size  field
    0       2     magic b"KP"
    2       1     protocol version (VERSION)
    3       1     message type (messages.Kind)
    4       4     payload length, at most MAX_PAYLOAD
    8       8     request id (a reply carries the id of its request)

The header is validated before a single payload byte is buffered, so an oversize or foreign
frame costs nothing but a closed connection. Payloads are read with :class:`Reader`, whose
every length and count is bounded before it is used; anything else raises
:class:`~kvcr_policy.errors.ProtocolError` and nothing but that.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvcr_policy.errors import ProtocolError

__all__ = [
    "HEADER",
    "MAGIC",
    "MAX_ADDRESS",
    "MAX_KEYS",
    "MAX_KEY_BYTES",
    "MAX_PAYLOAD",
    "MAX_TEXT",
    "VERSION",
    "Frame",
    "FrameReader",
    "Reader",
    "Writer",
    "pack_frame",
]

MAGIC = b"KP"
VERSION = 1
HEADER = struct.Struct("<2sBBIQ")
#: Largest payload of one frame: 65,536 keys of 64 bytes plus their pages fit well inside.
MAX_PAYLOAD = 16 << 20
#: Most keys (and pages) one request may name; batches are cut below this.
MAX_KEYS = 65536
MAX_KEY_BYTES = 1024
#: A UCX worker address is a few hundred bytes; multi-rail hosts reach a few KiB.
MAX_ADDRESS = 64 << 10
MAX_TEXT = 1 << 20

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class Frame:
    """One received frame: its type, request id and payload (validated header only)."""

    kind: int
    request: int
    payload: bytes


def pack_frame(kind: int, request: int, payload: bytes = b"") -> bytes:
    """Header + payload; refuses (ValueError) a payload over MAX_PAYLOAD."""
    if len(payload) > MAX_PAYLOAD:
        message = f"frame payload of {len(payload)} bytes exceeds MAX_PAYLOAD ({MAX_PAYLOAD})"
        raise ValueError(message)
    return HEADER.pack(MAGIC, VERSION, kind, len(payload), request) + payload


class FrameReader:
    """Cuts a byte stream into frames; holds at most one header plus one payload.

    ``known`` is the set of message types accepted; anything else, a bad magic or version, or
    a length over ``max_payload`` raises :class:`ProtocolError` as soon as the header is in.
    """

    def __init__(self, known: frozenset[int], max_payload: int = MAX_PAYLOAD) -> None:
        self._known = known
        self._max = max_payload
        self._buffer = bytearray()
        self._need: tuple[int, int, int] | None = None  # (kind, request, length) of the next

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes | memoryview) -> Iterator[Frame]:
        """Add bytes and yield every frame now complete, in order."""
        self._buffer += data
        while True:
            if self._need is None:
                if len(self._buffer) < HEADER.size:
                    return
                self._need = self._header(bytes(self._buffer[: HEADER.size]))
                del self._buffer[: HEADER.size]
            kind, request, length = self._need
            if len(self._buffer) < length:
                return
            payload = bytes(self._buffer[:length])
            del self._buffer[:length]
            self._need = None
            yield Frame(kind, request, payload)

    def _header(self, raw: bytes) -> tuple[int, int, int]:
        magic, version, kind, length, request = HEADER.unpack(raw)
        if magic != MAGIC:
            raise ProtocolError(f"bad frame magic {magic!r}, expected {MAGIC!r}: not a peer")
        if version != VERSION:
            message = (
                f"protocol version {version} is not supported (this side speaks {VERSION}); "
                "run the same kvcr_policy version on both peers"
            )
            raise ProtocolError(message)
        if kind not in self._known:
            raise ProtocolError(f"unknown message type {kind}")
        if length > self._max:
            message = f"frame payload of {length} bytes exceeds the limit of {self._max}"
            raise ProtocolError(message)
        return kind, request, length


class Writer:
    """Builds a payload; the sizes it writes are the ones :class:`Reader` checks."""

    __slots__ = ("_parts",)

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def u8(self, value: int) -> Writer:
        self._parts.append(_U8.pack(value))
        return self

    def u16(self, value: int) -> Writer:
        self._parts.append(_U16.pack(value))
        return self

    def u32(self, value: int) -> Writer:
        self._parts.append(_U32.pack(value))
        return self

    def u64(self, value: int) -> Writer:
        self._parts.append(_U64.pack(value))
        return self

    def blob(self, value: bytes) -> Writer:
        self._parts.append(_U32.pack(len(value)))
        self._parts.append(bytes(value))
        return self

    def text(self, value: str) -> Writer:
        return self.blob(value.encode("utf-8"))

    def int64s(self, values: np.ndarray) -> Writer:
        array = np.ascontiguousarray(values, dtype="<i8")
        self._parts.append(_U32.pack(len(array)))
        self._parts.append(array.tobytes())
        return self

    def flags(self, values: np.ndarray) -> Writer:
        array = np.ascontiguousarray(values, dtype=np.uint8)
        self._parts.append(_U32.pack(len(array)))
        self._parts.append(array.tobytes())
        return self

    def keys(self, keys: list[str]) -> Writer:
        encoded = [key.encode("utf-8") for key in keys]
        lengths = np.fromiter(map(len, encoded), dtype="<u2", count=len(encoded))
        if len(encoded) and int(lengths.max(initial=0)) > MAX_KEY_BYTES:
            raise ValueError(f"a key is longer than MAX_KEY_BYTES ({MAX_KEY_BYTES}) in UTF-8")
        self._parts.append(_U32.pack(len(encoded)))
        self._parts.append(lengths.tobytes())
        self._parts.append(b"".join(encoded))
        return self

    def payload(self) -> bytes:
        return b"".join(self._parts)


class Reader:
    """Reads a payload front to back; every read is bounds-checked, every count capped."""

    __slots__ = ("_data", "_pos", "_what")

    def __init__(self, data: bytes, what: str) -> None:
        self._data = data
        self._pos = 0
        self._what = what

    def _take(self, size: int, field: str) -> bytes:
        end = self._pos + size
        if size < 0 or end > len(self._data):
            left = len(self._data) - self._pos
            message = f"{self._what}: truncated at {field} (needs {size} bytes, {left} left)"
            raise ProtocolError(message)
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def u8(self, field: str) -> int:
        return int(_U8.unpack(self._take(1, field))[0])

    def u16(self, field: str) -> int:
        return int(_U16.unpack(self._take(2, field))[0])

    def u32(self, field: str) -> int:
        return int(_U32.unpack(self._take(4, field))[0])

    def u64(self, field: str) -> int:
        return int(_U64.unpack(self._take(8, field))[0])

    def count(self, field: str, limit: int) -> int:
        n = self.u32(field)
        if n > limit:
            raise ProtocolError(f"{self._what}: {field} count {n} exceeds the limit of {limit}")
        return n

    def blob(self, field: str, limit: int) -> bytes:
        return self._take(self.count(field, limit), field)

    def text(self, field: str, limit: int) -> str:
        raw = self.blob(field, limit)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ProtocolError(f"{self._what}: {field} is not UTF-8 ({err.reason})") from None

    def int64s(self, field: str, limit: int) -> np.ndarray:
        n = self.count(field, limit)
        return np.frombuffer(self._take(8 * n, field), dtype="<i8").astype(np.int64)

    def flags(self, field: str, limit: int) -> np.ndarray:
        n = self.count(field, limit)
        return np.frombuffer(self._take(n, field), dtype=np.uint8) != 0

    def keys(self, field: str, limit: int = MAX_KEYS) -> list[str]:
        n = self.count(field, limit)
        lengths = np.frombuffer(self._take(2 * n, field + " lengths"), dtype="<u2")
        if n and int(lengths.max()) > MAX_KEY_BYTES:
            message = f"{self._what}: a key of {field} is over {MAX_KEY_BYTES} bytes"
            raise ProtocolError(message)
        raw = self._take(int(lengths.sum(dtype=np.int64)), field)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ProtocolError(f"{self._what}: {field} is not UTF-8 ({err.reason})") from None
        if len(text) == len(raw):  # all ASCII: character offsets are byte offsets
            ends = np.cumsum(lengths, dtype=np.int64).tolist()
            starts = [0, *ends[:-1]] if ends else []
            return [text[a:b] for a, b in zip(starts, ends, strict=True)]
        keys, pos = [], 0
        for length in lengths.tolist():
            try:
                keys.append(raw[pos : pos + length].decode("utf-8"))
            except UnicodeDecodeError as err:
                message = f"{self._what}: a key of {field} is cut inside a character ({err.reason})"
                raise ProtocolError(message) from None
            pos += length
        return keys

    def end(self) -> None:
        """Refuse trailing bytes: a frame means exactly what its fields say."""
        if self._pos != len(self._data):
            extra = len(self._data) - self._pos
            raise ProtocolError(f"{self._what}: {extra} unexpected trailing bytes")
