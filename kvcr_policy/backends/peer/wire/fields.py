"""Field types of the peer messages: a Python type annotated with how it travels.

A message field is declared once, as a dataclass field whose annotation carries its
:class:`Codec` (``count: U64``); :func:`~.message.message` derives the message's encoder and
decoder from those annotations, in field order. Every read is bounded (see
:class:`~.payload.Reader`): texts, blobs and arrays by the limits named here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np

from .payload import MAX_ADDRESS, MAX_DESCRIPTORS, MAX_KEYS, MAX_TEXT, Reader, Writer

__all__ = [
    "U8",
    "U16",
    "U32",
    "U64",
    "Address",
    "Bool",
    "Codec",
    "Flags",
    "Int64s",
    "Json",
    "Keys",
    "Name",
    "Ranges",
    "Text",
    "Token",
]

_SHORT = 256


@dataclass(frozen=True, slots=True)
class Codec:
    """How one field is written and read (``read(reader, field name)``, bounded)."""

    name: str
    write: Callable[[Writer, Any], Any]
    read: Callable[[Reader, str], Any]


U8 = Annotated[int, Codec("u8", Writer.u8, Reader.u8)]
U16 = Annotated[int, Codec("u16", Writer.u16, Reader.u16)]
U32 = Annotated[int, Codec("u32", Writer.u32, Reader.u32)]
U64 = Annotated[int, Codec("u64", Writer.u64, Reader.u64)]
Bool = Annotated[bool, Codec("bool", lambda w, v: w.u8(int(v)), lambda r, f: r.u8(f) != 0)]
#: A pool name or host id.
Name = Annotated[str, Codec("name", Writer.text, lambda r, f: r.text(f, _SHORT))]
#: A layout or dtype name.
Token = Annotated[str, Codec("token", Writer.text, lambda r, f: r.text(f, 32))]
#: An error's text (cut to 4,000 characters when written).
Text = Annotated[
    str, Codec("text", lambda w, v: w.text(v[:4000]), lambda r, f: r.text(f, 16 << 10))
]
Json = Annotated[str, Codec("json", Writer.text, lambda r, f: r.text(f, MAX_TEXT))]
#: A UCX worker address.
Address = Annotated[bytes, Codec("address", Writer.blob, lambda r, f: r.blob(f, MAX_ADDRESS))]
Keys = Annotated[list[str], Codec("keys", Writer.keys, lambda r, f: r.keys(f, MAX_KEYS))]
#: Pages or slots, one per key.
Int64s = Annotated[np.ndarray, Codec("int64s", Writer.int64s, lambda r, f: r.int64s(f, MAX_KEYS))]
#: One flag per key.
Flags = Annotated[np.ndarray, Codec("flags", Writer.flags, lambda r, f: r.flags(f, MAX_KEYS))]
#: Byte offsets or lengths, one per descriptor.
Ranges = Annotated[
    np.ndarray, Codec("ranges", Writer.int64s, lambda r, f: r.int64s(f, MAX_DESCRIPTORS))
]
