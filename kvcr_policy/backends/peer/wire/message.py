"""The message layer: message types, error codes, the :func:`message` decorator, and
:func:`encode` / :func:`decode` of whole frames.

A message is a frozen dataclass declared with ``@message(Kind.X)``; each field's annotation
names its wire codec (:mod:`.fields`), so the field list *is* the payload layout and nothing
else declares it. Reading goes through :class:`~.payload.Reader`, so every length and count is
bounded before it is used, and :meth:`Message.check` refuses values that decode but cannot be
meant. The messages themselves are in :mod:`.messages`.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

from typing_extensions import dataclass_transform

from kvcr_policy.errors import ProtocolError

from .fields import Codec
from .framing import Frame, pack_frame
from .payload import Reader, Writer

__all__ = ["KINDS", "Err", "Kind", "Message", "decode", "encode", "message"]


class Kind(enum.IntEnum):
    """Message types: the header's type byte."""

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
    POST = 24
    POSTED = 25
    CHALLENGE = 26
    AUTH = 27
    COPIED = 28


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
    AUTH = 8


class Message:
    """Base of every message; ``FIELDS`` (derived by :func:`message`) pairs names and codecs."""

    __slots__ = ()

    KIND: ClassVar[Kind]
    FIELDS: ClassVar[tuple[tuple[str, Codec], ...]] = ()

    def write(self, w: Writer) -> None:
        for name, codec in self.FIELDS:
            codec.write(w, getattr(self, name))

    @classmethod
    def read(cls, r: Reader) -> Any:
        decoded = cls(*(codec.read(r, name) for name, codec in cls.FIELDS))
        decoded.check()
        return decoded

    def check(self) -> None:
        """Refuse (ProtocolError) values that decode but cannot be meant."""


_TYPES: dict[int, type[Message]] = {}
M = TypeVar("M", bound=type[Message])


@dataclass_transform(frozen_default=True, eq_default=False)
def message(kind: Kind) -> Callable[[M], M]:
    """Make a class a frozen, slotted dataclass and the message of type ``kind``.

    Every field must be annotated with a codec type from :mod:`.fields`; encoding and decoding
    follow the fields in order. Arrays compare by identity (``eq=False``): compare fields.
    """

    def define(cls: M) -> M:
        made: Any = dataclasses.dataclass(frozen=True, slots=True, eq=False)(cls)
        hints = typing.get_type_hints(made, include_extras=True)
        codecs = []
        for field in dataclasses.fields(made):
            codec = next(
                (c for c in getattr(hints[field.name], "__metadata__", ()) if isinstance(c, Codec)),
                None,
            )
            if codec is None:
                text = (
                    f"message {made.__name__}.{field.name}: annotate the field with a codec "
                    "type from kvcr_policy.backends.peer.wire.fields (U32, Keys, ...)"
                )
                raise TypeError(text)
            codecs.append((field.name, codec))
        if int(kind) in _TYPES:
            text = f"message type {kind.name} is already {_TYPES[int(kind)].__name__}"
            raise TypeError(text)
        made.KIND = kind
        made.FIELDS = tuple(codecs)
        _TYPES[int(kind)] = made
        return cast(M, made)

    return define


def encode(message: Message, request: int) -> bytes:
    """The whole frame (header and payload) of ``message`` answering or asking ``request``."""
    w = Writer()
    message.write(w)
    return pack_frame(int(message.KIND), request, w.payload())


def decode(frame: Frame) -> Message:
    """The message a frame carries; ProtocolError (only) when its payload is malformed."""
    cls = _TYPES.get(frame.kind)
    if cls is None:
        raise ProtocolError(f"unknown message type {frame.kind}")
    r = Reader(frame.payload, Kind(frame.kind).name)
    decoded: Message = cls.read(r)
    r.end()
    return decoded
