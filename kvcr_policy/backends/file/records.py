"""The commit record of one slot: what the index file says the slot holds, checked on read.

The index file is an array of fixed-size records, record ``i`` for slot ``i`` of the slot file.
A record is written only after its page's bytes are written (and made durable, under the sync
policy ``batch``), and a slot's record is turned into a tombstone before its bytes are
overwritten; so a record that decodes cleanly names bytes that were completely written. Each
record carries its own CRC-32C (a torn record is damaged, never misread) and the page's CRC-32C
(bytes torn by a power loss under the sync policy ``none`` fail it). Layout, little-endian::

    offset  size  field
    0       4     magic b"KVFR"
    4       2     format version (1)
    6       2     state: 0 free (a tombstone or never written), 1 live
    8       8     sequence number of the write (restores the eviction order on open)
    16      8     the slot number (a record copied to another position is damaged)
    24      8     page bytes (the pool's geometry)
    32      4     CRC-32C of the page's bytes
    36      4     key length in UTF-8 bytes (1..1024)
    40      4     CRC-32C of bytes 0..40 and the key
    44      20    zero
    64      1024  the key, UTF-8, zero padded

A block of zeros (a slot never written) decodes as free. The checksum is CRC-32C from the
``crc32c`` package (:func:`checksum`): SSE4.2/ARMv8 instructions, about 11 GB/s a core on our
machines where :func:`checksum` gives 2.3-3.5 (the read path checks every page, so this is
the tier's largest CPU cost), and it releases the GIL for buffers of 32 KiB and more.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import numpy as np
from crc32c import crc32c as checksum

from ...keys import MAX_KEY_BYTES

__all__ = [
    "HEADER_BYTES",
    "RECORD_BYTES",
    "Damage",
    "Record",
    "checksum",
    "decode",
    "encode",
    "tombstone",
]

MAGIC = b"KVFR"
VERSION = 1
_HEAD = struct.Struct("<4sHHQQQII")  # the fields the record's own CRC covers, then the CRC
_CRC = struct.Struct("<I")
HEADER_BYTES = 64
RECORD_BYTES = HEADER_BYTES + MAX_KEY_BYTES
_FREE, _LIVE = 0, 1

#: The records of many slots as one numpy view (recovery decodes the whole index at once).
RECORD_DTYPE = np.dtype(
    [
        ("magic", "S4"),
        ("version", "<u2"),
        ("state", "<u2"),
        ("seq", "<u8"),
        ("slot", "<u8"),
        ("page_bytes", "<u8"),
        ("page_crc", "<u4"),
        ("key_len", "<u4"),
        ("crc", "<u4"),
        ("pad", "V20"),
        ("key", f"V{MAX_KEY_BYTES}"),
    ]
)
assert RECORD_DTYPE.itemsize == RECORD_BYTES


class Damage(enum.Enum):
    """Why a record that is not free cannot be used."""

    MAGIC = "bad magic or version"
    CRC = "record checksum mismatch (torn or overwritten record)"
    SLOT = "record names another slot"
    PAGE_BYTES = "record is for another page size"
    KEY = "key length out of range or not UTF-8"


@dataclass(frozen=True, slots=True)
class Record:
    """A live slot: its key, the page's CRC-32C and the write's sequence number."""

    slot: int
    key: str
    page_crc: int
    seq: int


def encode(record: Record, page_bytes: int) -> bytes:
    """The record's :data:`RECORD_BYTES` bytes."""
    key = record.key.encode("utf-8")
    head = _HEAD.pack(
        MAGIC, VERSION, _LIVE, record.seq, record.slot, page_bytes, record.page_crc, len(key)
    )
    crc = checksum(key, checksum(head))
    body = head + _CRC.pack(crc)
    return body + bytes(HEADER_BYTES - len(body)) + key + bytes(MAX_KEY_BYTES - len(key))


def tombstone(slot: int) -> bytes:
    """A free record for ``slot``: its key is gone, whatever the slot's bytes still hold."""
    head = _HEAD.pack(MAGIC, VERSION, _FREE, 0, slot, 0, 0, 0)
    body = head + _CRC.pack(checksum(head))
    return body + bytes(RECORD_BYTES - len(body))


def decode(raw: bytes, slot: int, page_bytes: int) -> Record | Damage | None:
    """The record at position ``slot``: a :class:`Record`, None when the slot is free, or the
    :class:`Damage` that makes it unusable."""
    data = raw
    magic, version, state, seq, named, pages, page_crc, key_len = _HEAD.unpack_from(data)
    if magic == b"\0\0\0\0" and not any(data):
        return None  # never written
    if magic != MAGIC or version != VERSION:
        return Damage.MAGIC
    (crc,) = _CRC.unpack_from(data, _HEAD.size)
    if state == _FREE:
        return None if crc == checksum(data[: _HEAD.size]) else Damage.CRC
    if not 1 <= key_len <= MAX_KEY_BYTES:
        return Damage.KEY
    key = data[HEADER_BYTES : HEADER_BYTES + key_len]
    if state != _LIVE or crc != checksum(key, checksum(data[: _HEAD.size])):
        return Damage.CRC
    if named != slot:
        return Damage.SLOT
    if pages != page_bytes:
        return Damage.PAGE_BYTES
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return Damage.KEY
    return Record(slot, text, page_crc, seq)
