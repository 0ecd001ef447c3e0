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
#: 3: a mutual challenge-response (HELLO, CHALLENGE, AUTH, WELCOME) before anything else, and
#: every key scoped to the tenant the secret belongs to (2: no authentication; the client
#: shaped descriptors and named them in SEND and POST; 1: both sides planned them).
VERSION = 3
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
    a length over ``limit`` raises :class:`ProtocolError` as soon as the header is in. The
    owner may lower or raise ``limit`` between frames (a server accepts only small frames
    until a client has authenticated).
    """

    def __init__(self, known: frozenset[int], max_payload: int = MAX_PAYLOAD) -> None:
        self._known = known
        self.limit = max_payload
        self._buffer = bytearray()
        self._need: tuple[int, int, int] | None = None  # (kind, request, length) of the next
        self._skip = 0  # payload bytes of a discarded frame still to come

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    @property
    def partial(self) -> bool:
        """Whether part of a frame has arrived and the rest has not."""
        return self._need is not None or bool(self._buffer) or self._skip > 0

    @property
    def skipping(self) -> int:
        """Payload bytes of a discarded frame still to be dropped as they arrive."""
        return self._skip

    def discard(self) -> tuple[int, int, int]:
        """Drop the frame whose header is in: its payload buffered so far, and the rest as it
        arrives (the stream stays in step, so the connection can go on); its (kind, request,
        length)."""
        if self._need is None:
            raise ProtocolError("no frame to discard: its header has not arrived")
        need, self._need = self._need, None
        self._skip = need[2] - len(self._buffer)
        self._buffer.clear()  # a frame in progress: the buffer holds its payload only
        return need

    @property
    def expecting(self) -> int:
        """The payload length of the frame whose header is in (0 when none is)."""
        return self._need[2] if self._need is not None else 0

    def feed(self, data: bytes | memoryview) -> Iterator[Frame]:
        """Add bytes and yield every frame now complete, in order."""
        if self._skip:
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = memoryview(data)[dropped:]
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
        if length > self.limit:
            message = f"frame payload of {length} bytes exceeds the limit of {self.limit}"
            raise ProtocolError(message)
        return kind, request, length
