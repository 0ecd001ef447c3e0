"""Payload encoding: a writer, and a reader whose every length and count is bounded before use.

Anything malformed raises :class:`~kvcr_policy.errors.ProtocolError` and nothing but that; the
limits below are the ones the message fields (:mod:`.fields`) read with.
"""

from __future__ import annotations

import struct

import numpy as np

from kvcr_policy.errors import ProtocolError

__all__ = [
    "MAX_ADDRESS",
    "MAX_DESCRIPTORS",
    "MAX_KEYS",
    "MAX_KEY_BYTES",
    "MAX_TEXT",
    "Reader",
    "Writer",
]

#: Most keys (and pages) one request may name; batches are cut below this.
MAX_KEYS = 65536
MAX_KEY_BYTES = 1024
#: Most descriptors one SEND or POST may name: two int64 arrays of this fill half a frame.
MAX_DESCRIPTORS = 1 << 19
#: A UCX worker address is a few hundred bytes; multi-rail hosts reach a few KiB.
MAX_ADDRESS = 64 << 10
MAX_TEXT = 1 << 20

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


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
