"""The peer control protocol's framing: a fixed header, then a payload of bounded size.

Every frame is a 16-byte little-endian header followed by ``length`` payload bytes::

    offset  size  field
    0       2     magic b"KP"
    2       1     protocol version (VERSION)
    3       1     message type (:class:`~.message.Kind`)
    4       4     payload length, at most MAX_PAYLOAD
    8       8     request id (a reply carries the id of its request)

The header is validated before a single payload byte is buffered, so an oversize or foreign
frame costs nothing but a closed connection. Payloads are read by :mod:`.payload`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from kvcr_policy.errors import ProtocolError

__all__ = ["HEADER", "MAGIC", "MAX_PAYLOAD", "VERSION", "Frame", "FrameReader", "pack_frame"]

MAGIC = b"KP"
#: 2: the client shapes descriptors and names them in SEND and POST (1 planned them on both
#: sides from negotiated merge/split flags).
VERSION = 2
HEADER = struct.Struct("<2sBBIQ")
#: Largest payload of one frame: 65,536 keys of 64 bytes, or 524,288 descriptors, fit inside.
MAX_PAYLOAD = 16 << 20


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
