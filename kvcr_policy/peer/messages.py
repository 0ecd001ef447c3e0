"""The peer protocol's messages: one frozen value per type, each with its payload codec.

A conversation (c: client, s: server)::

    c HELLO    -> s WELCOME          versions, capabilities, host ids, UCX worker addresses
    c ATTACH   -> s ATTACHED         a pool geometry -> the tier that mirrors it
    c EXISTS   -> s COUNT            one round trip per metadata-query batch
    c CLAIM    -> s CLAIMED          slots of the leading present run, claimed on the server
    c SEND     -> s SENT             client posted receives; server sends, then releases
    c RELEASE                        client will not read a claim after all
    c RESERVE  -> s RESERVED         slots for a write; server posted receives
    c COMMIT   -> s WRITTEN          client's sends finished; server publishes what arrived
    c DELETE / CLEAR -> s COUNT
    c STATS    -> s STATS_REPLY
    c PROBE    -> s SENT             one message of N bytes (the benchmark's limit)
    c PING     -> s PONG
    s ERROR                          a refused request (connection stays) or a closing one

Data never travels in frames: it moves as UCX tag messages ``tag_base + i``, one per wire
descriptor ``i``, straight between the pool and the tier.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..errors import ProtocolError
from .protocol import MAX_ADDRESS, MAX_KEYS, MAX_TEXT, Frame, Reader, Writer, pack_frame

__all__ = ["KINDS", "Err", "Kind", "Message", "decode", "encode"]

_SHORT = 256


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


class Message:
    """Base of every message; subclasses define KIND, ``write`` and ``read``."""

    KIND: ClassVar[Kind]

    def write(self, w: Writer) -> None:
        pass

    @classmethod
    def read(cls, r: Reader) -> Message:
        return cls()


def _keys_pages(r: Reader, keys_field: str) -> tuple[list[str], np.ndarray]:
    keys = r.keys(keys_field, MAX_KEYS)
    pages = r.int64s("pages", MAX_KEYS)
    if len(pages) != len(keys):
        raise ProtocolError(f"{len(keys)} keys but {len(pages)} pages; expected one page per key")
    return keys, pages


@dataclass(frozen=True, slots=True)
class Hello(Message):
    KIND: ClassVar[Kind] = Kind.HELLO
    capabilities: int
    tls: int  # 0 auto, 1 sm, 2 tcp
    heartbeat_ms: int
    op_timeout_ms: int
    host_id: str
    address: bytes
    name: str

    def write(self, w: Writer) -> None:
        w.u32(self.capabilities).u8(self.tls).u32(self.heartbeat_ms).u32(self.op_timeout_ms)
        w.text(self.host_id).blob(self.address).text(self.name)

    @classmethod
    def read(cls, r: Reader) -> Hello:
        caps, tls, beat, timeout = r.u32("caps"), r.u8("tls"), r.u32("beat"), r.u32("timeout")
        if tls > 2:
            raise ProtocolError(f"HELLO: tls {tls} is not 0 (auto), 1 (sm) or 2 (tcp)")
        host = r.text("host_id", _SHORT)
        address = r.blob("address", MAX_ADDRESS)
        return cls(caps, tls, beat, timeout, host, address, r.text("name", _SHORT))


@dataclass(frozen=True, slots=True)
class Welcome(Message):
    KIND: ClassVar[Kind] = Kind.WELCOME
    capabilities: int
    tls: int  # 1 sm, 2 tcp
    server_id: int
    host_id: str
    address: bytes

    def write(self, w: Writer) -> None:
        w.u32(self.capabilities).u8(self.tls).u64(self.server_id)
        w.text(self.host_id).blob(self.address)

    @classmethod
    def read(cls, r: Reader) -> Welcome:
        caps, tls, server = r.u32("caps"), r.u8("tls"), r.u64("server_id")
        if tls not in (1, 2):
            raise ProtocolError(f"WELCOME: tls {tls} is not 1 (sm) or 2 (tcp)")
        return cls(caps, tls, server, r.text("host_id", _SHORT), r.blob("address", MAX_ADDRESS))


@dataclass(frozen=True, slots=True)
class Error(Message):
    KIND: ClassVar[Kind] = Kind.ERROR
    code: int
    text: str

    def write(self, w: Writer) -> None:
        w.u16(self.code).text(self.text[:4000])

    @classmethod
    def read(cls, r: Reader) -> Error:
        return cls(r.u16("code"), r.text("text", 16 << 10))


@dataclass(frozen=True, slots=True)
class Attach(Message):
    KIND: ClassVar[Kind] = Kind.ATTACH
    name: str
    layout: str
    layers: int
    heads: int
    head_dim: int
    dtype: str
    page_size: int
    tokens: int
    mla: bool
    coalesce: bool
    split_bytes: int  # 0: no split

    def write(self, w: Writer) -> None:
        w.text(self.name).text(self.layout).u32(self.layers).u32(self.heads).u32(self.head_dim)
        w.text(self.dtype).u32(self.page_size).u64(self.tokens).u8(self.mla).u8(self.coalesce)
        w.u64(self.split_bytes)

    @classmethod
    def read(cls, r: Reader) -> Attach:
        name, layout = r.text("name", _SHORT), r.text("layout", 32)
        layers, heads, head_dim = r.u32("layers"), r.u32("heads"), r.u32("head_dim")
        dtype, page_size, tokens = r.text("dtype", 32), r.u32("page_size"), r.u64("tokens")
        mla, coalesce, split = r.u8("mla") != 0, r.u8("coalesce") != 0, r.u64("split")
        return cls(
            name, layout, layers, heads, head_dim, dtype, page_size, tokens, mla, coalesce, split
        )


@dataclass(frozen=True, slots=True)
class Attached(Message):
    KIND: ClassVar[Kind] = Kind.ATTACHED
    pool: int
    slots: int

    def write(self, w: Writer) -> None:
        w.u32(self.pool).u64(self.slots)

    @classmethod
    def read(cls, r: Reader) -> Attached:
        return cls(r.u32("pool"), r.u64("slots"))


@dataclass(frozen=True, slots=True)
class Keys(Message):
    """EXISTS and DELETE: a pool and keys."""

    KIND: ClassVar[Kind] = Kind.EXISTS
    pool: int
    keys: list[str] = field(hash=False)

    def write(self, w: Writer) -> None:
        w.u32(self.pool).keys(self.keys)

    @classmethod
    def read(cls, r: Reader) -> Keys:
        return cls(r.u32("pool"), r.keys("keys"))


@dataclass(frozen=True, slots=True)
class Exists(Keys):
    KIND: ClassVar[Kind] = Kind.EXISTS


@dataclass(frozen=True, slots=True)
class Delete(Keys):
    KIND: ClassVar[Kind] = Kind.DELETE


@dataclass(frozen=True, slots=True)
class PoolOnly(Message):
    KIND: ClassVar[Kind] = Kind.CLEAR
    pool: int

    def write(self, w: Writer) -> None:
        w.u32(self.pool)

    @classmethod
    def read(cls, r: Reader) -> PoolOnly:
        return cls(r.u32("pool"))


@dataclass(frozen=True, slots=True)
class Clear(PoolOnly):
    KIND: ClassVar[Kind] = Kind.CLEAR


@dataclass(frozen=True, slots=True)
class Stats(PoolOnly):
    KIND: ClassVar[Kind] = Kind.STATS


@dataclass(frozen=True, slots=True)
class Count(Message):
    KIND: ClassVar[Kind] = Kind.COUNT
    count: int

    def write(self, w: Writer) -> None:
        w.u64(self.count)

    @classmethod
    def read(cls, r: Reader) -> Count:
        return cls(r.u64("count"))


@dataclass(frozen=True, slots=True)
class Claim(Message):
    """CLAIM and RESERVE: keys and the client pool pages they go to or come from."""

    KIND: ClassVar[Kind] = Kind.CLAIM
    pool: int
    keys: list[str] = field(hash=False)
    pages: np.ndarray = field(hash=False, compare=False)

    def write(self, w: Writer) -> None:
        w.u32(self.pool).keys(self.keys).int64s(self.pages)

    @classmethod
    def read(cls, r: Reader) -> Claim:
        pool = r.u32("pool")
        keys, pages = _keys_pages(r, "keys")
        return cls(pool, keys, pages)


@dataclass(frozen=True, slots=True)
class Reserve(Claim):
    KIND: ClassVar[Kind] = Kind.RESERVE


@dataclass(frozen=True, slots=True)
class Claimed(Message):
    KIND: ClassVar[Kind] = Kind.CLAIMED
    claim: int
    slots: np.ndarray = field(hash=False, compare=False)

    def write(self, w: Writer) -> None:
        w.u64(self.claim).int64s(self.slots)

    @classmethod
    def read(cls, r: Reader) -> Claimed:
        return cls(r.u64("claim"), r.int64s("slots", MAX_KEYS))


@dataclass(frozen=True, slots=True)
class Plan(Message):
    """The wire plan both sides computed: count, bytes and digest must agree."""

    KIND: ClassVar[Kind] = Kind.SEND
    handle: int
    tag_base: int
    count: int
    nbytes: int
    digest: int

    def write(self, w: Writer) -> None:
        w.u64(self.handle).u64(self.tag_base).u32(self.count).u64(self.nbytes).u32(self.digest)

    @classmethod
    def read(cls, r: Reader) -> Plan:
        return cls(r.u64("handle"), r.u64("tag"), r.u32("count"), r.u64("nbytes"), r.u32("digest"))


@dataclass(frozen=True, slots=True)
class Send(Plan):
    KIND: ClassVar[Kind] = Kind.SEND


@dataclass(frozen=True, slots=True)
class Reserved(Message):
    KIND: ClassVar[Kind] = Kind.RESERVED
    reservation: int
    slots: np.ndarray = field(hash=False, compare=False)
    plan: Plan = field(hash=False)

    def write(self, w: Writer) -> None:
        w.u64(self.reservation).int64s(self.slots)
        self.plan.write(w)

    @classmethod
    def read(cls, r: Reader) -> Reserved:
        return cls(r.u64("reservation"), r.int64s("slots", MAX_KEYS), Plan.read(r))


@dataclass(frozen=True, slots=True)
class Flags(Message):
    """COMMIT and WRITTEN: a reservation and one flag per covered key."""

    KIND: ClassVar[Kind] = Kind.COMMIT
    reservation: int
    ok: np.ndarray = field(hash=False, compare=False)

    def write(self, w: Writer) -> None:
        w.u64(self.reservation).flags(self.ok)

    @classmethod
    def read(cls, r: Reader) -> Flags:
        return cls(r.u64("reservation"), r.flags("ok", MAX_KEYS))


@dataclass(frozen=True, slots=True)
class Commit(Flags):
    KIND: ClassVar[Kind] = Kind.COMMIT


@dataclass(frozen=True, slots=True)
class Written(Flags):
    KIND: ClassVar[Kind] = Kind.WRITTEN


@dataclass(frozen=True, slots=True)
class Sent(Message):
    KIND: ClassVar[Kind] = Kind.SENT
    claim: int
    ok: bool

    def write(self, w: Writer) -> None:
        w.u64(self.claim).u8(self.ok)

    @classmethod
    def read(cls, r: Reader) -> Sent:
        return cls(r.u64("claim"), r.u8("ok") != 0)


@dataclass(frozen=True, slots=True)
class Release(Message):
    KIND: ClassVar[Kind] = Kind.RELEASE
    claim: int

    def write(self, w: Writer) -> None:
        w.u64(self.claim)

    @classmethod
    def read(cls, r: Reader) -> Release:
        return cls(r.u64("claim"))


@dataclass(frozen=True, slots=True)
class StatsReply(Message):
    KIND: ClassVar[Kind] = Kind.STATS_REPLY
    text: str

    def write(self, w: Writer) -> None:
        w.text(self.text)

    @classmethod
    def read(cls, r: Reader) -> StatsReply:
        return cls(r.text("json", MAX_TEXT))


@dataclass(frozen=True, slots=True)
class Probe(Message):
    KIND: ClassVar[Kind] = Kind.PROBE
    pool: int
    tag_base: int
    nbytes: int

    def write(self, w: Writer) -> None:
        w.u32(self.pool).u64(self.tag_base).u64(self.nbytes)

    @classmethod
    def read(cls, r: Reader) -> Probe:
        return cls(r.u32("pool"), r.u64("tag"), r.u64("nbytes"))


@dataclass(frozen=True, slots=True)
class Ping(Message):
    KIND: ClassVar[Kind] = Kind.PING


@dataclass(frozen=True, slots=True)
class Pong(Message):
    KIND: ClassVar[Kind] = Kind.PONG


_TYPES: dict[int, type[Message]] = {
    int(cls.KIND): cls
    for cls in (
        Hello,
        Welcome,
        Error,
        Attach,
        Attached,
        Exists,
        Count,
        Claim,
        Claimed,
        Send,
        Sent,
        Release,
        Reserve,
        Reserved,
        Commit,
        Written,
        Delete,
        Clear,
        Stats,
        StatsReply,
        Probe,
        Ping,
        Pong,
    )
}


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
    message = cls.read(r)
    r.end()
    return message
