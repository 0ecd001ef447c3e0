"""The peer protocol's message layer: message kinds, error codes, field codecs, the base
class every message derives from, and :func:`encode` / :func:`decode` of whole frames.

A message is a frozen dataclass whose ``FIELDS`` name each field and how it travels (see
``CODECS``); reading goes through :class:`~.protocol.Reader`, so every length
and count is bounded before it is used, and ``check`` refuses values that decode but cannot
be meant. The messages themselves are in :mod:`kvcr_policy.backends.peer.messages`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, ClassVar

from kvcr_policy.errors import ProtocolError

from .protocol import MAX_ADDRESS, MAX_KEYS, MAX_TEXT, Frame, Reader, Writer, pack_frame

__all__ = ["ALIGN_BYTES", "CODECS", "KINDS", "Err", "Kind", "Message", "decode", "encode"]

_SHORT = 256
#: Tier offsets mirror the pool's address modulo this (a 4 KiB page).
ALIGN_BYTES = 4096


class Kind(enum.IntEnum):
    HELLO = 1
    WELCOME = 2
    ERROR = 3
    ATTACH = 4
    ATTACHED = 5
    EXISTS = 6
    COUNT = 7
    CLAIM = 8
    CLAIMED = 9
    SEND = 10
    SENT = 11
    RELEASE = 12
    RESERVE = 13
    RESERVED = 14
    COMMIT = 15
    WRITTEN = 16
    DELETE = 17
    CLEAR = 18
    STATS = 19
    STATS_REPLY = 20
    PROBE = 21
    PING = 22
    PONG = 23


KINDS = frozenset(int(k) for k in Kind)


class Err(enum.IntEnum):
    """Codes of ERROR frames."""

    PROTOCOL = 1
    BAD_REQUEST = 2
    CAPACITY = 3
    UNSUPPORTED = 4
    SHUTTING_DOWN = 5
    TIMEOUT = 6
    INTERNAL = 7


#: How each field kind is written and read; every read is bounded (see protocol.Reader).
CODECS: dict[str, tuple[Callable[[Writer, Any], Any], Callable[[Reader, str], Any]]] = {
    "u8": (Writer.u8, Reader.u8),
    "u16": (Writer.u16, Reader.u16),
    "u32": (Writer.u32, Reader.u32),
    "u64": (Writer.u64, Reader.u64),
    "bool": (lambda w, v: w.u8(int(v)), lambda r, f: r.u8(f) != 0),
    "name": (Writer.text, lambda r, f: r.text(f, _SHORT)),
    "token": (Writer.text, lambda r, f: r.text(f, 32)),
    "text": (lambda w, v: w.text(v[:4000]), lambda r, f: r.text(f, 16 << 10)),
    "json": (Writer.text, lambda r, f: r.text(f, MAX_TEXT)),
    "address": (Writer.blob, lambda r, f: r.blob(f, MAX_ADDRESS)),
    "keys": (Writer.keys, lambda r, f: r.keys(f, MAX_KEYS)),
    "int64s": (Writer.int64s, lambda r, f: r.int64s(f, MAX_KEYS)),
    "flags": (Writer.flags, lambda r, f: r.flags(f, MAX_KEYS)),
}


class Message:
    """Base of every message: ``FIELDS`` names each dataclass field and its codec, in order."""

    KIND: ClassVar[Kind]
    FIELDS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "KIND" in cls.__dict__:
            _TYPES[int(cls.KIND)] = cls  # a subclass sharing its parent's kind replaces it

    def write(self, w: Writer) -> None:
        for name, codec in self.FIELDS:
            CODECS[codec][0](w, getattr(self, name))

    @classmethod
    def read(cls, r: Reader) -> Any:
        message = cls(*(CODECS[codec][1](r, name) for name, codec in cls.FIELDS))
        message.check()
        return message

    def check(self) -> None:
        """Refuse (ProtocolError) values that decode but cannot be meant."""


_TYPES: dict[int, type[Message]] = {}


def encode(message: Message, request: int) -> bytes:
    """The whole frame (header and payload) of ``message`` answering or asking ``request``."""
    w = Writer()
    message.write(w)
    return pack_frame(int(message.KIND), request, w.payload())


def decode(frame: Frame) -> Message:
    """The message a frame carries; ProtocolError (only) when its payload is malformed."""
    from . import messages  # noqa: F401  (defining the messages registers them)

    cls = _TYPES.get(frame.kind)
    if cls is None:
        raise ProtocolError(f"unknown message type {frame.kind}")
    r = Reader(frame.payload, Kind(frame.kind).name)
    message: Message = cls.read(r)
    r.end()
    return message
