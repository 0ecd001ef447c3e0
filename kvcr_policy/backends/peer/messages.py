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

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from kvcr_policy.errors import ProtocolError

from .wire import ALIGN_BYTES, CODECS, KINDS, Err, Kind, Message, decode, encode

__all__ = ["ALIGN_BYTES", "KINDS", "Err", "Kind", "Message", "decode", "encode"]


@dataclass(frozen=True, slots=True)
class Hello(Message):
    KIND: ClassVar[Kind] = Kind.HELLO
    FIELDS = (("capabilities", "u32"), ("tls", "u8"), ("heartbeat_ms", "u32"),
              ("op_timeout_ms", "u32"), ("host_id", "name"), ("address", "address"),
              ("name", "name"))  # fmt: skip
    capabilities: int
    tls: int  # 0 auto, 1 sm, 2 tcp
    heartbeat_ms: int
    op_timeout_ms: int
    host_id: str
    address: bytes
    name: str

    def check(self) -> None:
        if self.tls > 2:
            raise ProtocolError(f"HELLO: tls {self.tls} is not 0 (auto), 1 (sm) or 2 (tcp)")


@dataclass(frozen=True, slots=True)
class Welcome(Message):
    KIND: ClassVar[Kind] = Kind.WELCOME
    FIELDS = (("capabilities", "u32"), ("tls", "u8"), ("server_id", "u64"),
              ("host_id", "name"), ("address", "address"))  # fmt: skip
    capabilities: int
    tls: int  # 1 sm, 2 tcp
    server_id: int
    host_id: str
    address: bytes

    def check(self) -> None:
        if self.tls not in (1, 2):
            raise ProtocolError(f"WELCOME: tls {self.tls} is not 1 (sm) or 2 (tcp)")


@dataclass(frozen=True, slots=True)
class Error(Message):
    KIND: ClassVar[Kind] = Kind.ERROR
    FIELDS = (("code", "u16"), ("text", "text"))
    code: int
    text: str


@dataclass(frozen=True, slots=True)
class Attach(Message):
    KIND: ClassVar[Kind] = Kind.ATTACH
    FIELDS = (("name", "name"), ("layout", "token"), ("layers", "u32"), ("heads", "u32"),
              ("head_dim", "u32"), ("dtype", "token"), ("page_size", "u32"), ("tokens", "u64"),
              ("mla", "bool"), ("coalesce", "bool"), ("split_bytes", "u64"),
              ("align", "u32"))  # fmt: skip
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
    align: int  # the pool's address modulo ALIGN_BYTES: the tier mirrors it (see Tiers)

    def check(self) -> None:
        if self.align >= ALIGN_BYTES:
            raise ProtocolError(f"ATTACH: align {self.align} is not below {ALIGN_BYTES}")


@dataclass(frozen=True, slots=True)
class Attached(Message):
    KIND: ClassVar[Kind] = Kind.ATTACHED
    FIELDS = (("pool", "u32"), ("slots", "u64"))
    pool: int
    slots: int


@dataclass(frozen=True, slots=True)
class Exists(Message):
    KIND: ClassVar[Kind] = Kind.EXISTS
    FIELDS = (("pool", "u32"), ("keys", "keys"))
    pool: int
    keys: list[str] = field(hash=False)


@dataclass(frozen=True, slots=True)
class Delete(Exists):
    KIND: ClassVar[Kind] = Kind.DELETE


@dataclass(frozen=True, slots=True)
class Clear(Message):
    KIND: ClassVar[Kind] = Kind.CLEAR
    FIELDS = (("pool", "u32"),)
    pool: int


@dataclass(frozen=True, slots=True)
class Stats(Clear):
    KIND: ClassVar[Kind] = Kind.STATS


@dataclass(frozen=True, slots=True)
class Count(Message):
    KIND: ClassVar[Kind] = Kind.COUNT
    FIELDS = (("count", "u64"),)
    count: int


@dataclass(frozen=True, slots=True)
class Claim(Message):
    """CLAIM and RESERVE: keys and the client pool pages they go to or come from."""

    KIND: ClassVar[Kind] = Kind.CLAIM
    FIELDS = (("pool", "u32"), ("keys", "keys"), ("pages", "int64s"))
    pool: int
    keys: list[str] = field(hash=False)
    pages: np.ndarray = field(hash=False, compare=False)

    def check(self) -> None:
        if len(self.pages) != len(self.keys):
            message = (
                f"{len(self.keys)} keys but {len(self.pages)} pages; expected one page per key"
            )
            raise ProtocolError(message)


@dataclass(frozen=True, slots=True)
class Reserve(Claim):
    KIND: ClassVar[Kind] = Kind.RESERVE


@dataclass(frozen=True, slots=True)
class Claimed(Message):
    KIND: ClassVar[Kind] = Kind.CLAIMED
    FIELDS = (("claim", "u64"), ("slots", "int64s"))
    claim: int
    slots: np.ndarray = field(hash=False, compare=False)


@dataclass(frozen=True, slots=True)
class Plan(Message):
    """SEND, and part of RESERVED: the wire plan's size and digest, which both sides check."""

    KIND: ClassVar[Kind] = Kind.SEND
    FIELDS = (("handle", "u64"), ("tag_base", "u64"), ("count", "u32"), ("nbytes", "u64"),
              ("digest", "u32"))  # fmt: skip
    handle: int
    tag_base: int
    count: int
    nbytes: int
    digest: int


@dataclass(frozen=True, slots=True)
class Send(Plan):
    KIND: ClassVar[Kind] = Kind.SEND


CODECS["plan"] = (lambda w, v: v.write(w), lambda r, f: Plan.read(r))


@dataclass(frozen=True, slots=True)
class Reserved(Message):
    KIND: ClassVar[Kind] = Kind.RESERVED
    FIELDS = (("reservation", "u64"), ("slots", "int64s"), ("plan", "plan"))
    reservation: int
    slots: np.ndarray = field(hash=False, compare=False)
    plan: Plan = field(hash=False)


@dataclass(frozen=True, slots=True)
class Commit(Message):
    """COMMIT and WRITTEN: a reservation and one flag per covered key."""

    KIND: ClassVar[Kind] = Kind.COMMIT
    FIELDS = (("reservation", "u64"), ("ok", "flags"))
    reservation: int
    ok: np.ndarray = field(hash=False, compare=False)


@dataclass(frozen=True, slots=True)
class Written(Commit):
    KIND: ClassVar[Kind] = Kind.WRITTEN


@dataclass(frozen=True, slots=True)
class Sent(Message):
    KIND: ClassVar[Kind] = Kind.SENT
    FIELDS = (("claim", "u64"), ("ok", "bool"))
    claim: int
    ok: bool


@dataclass(frozen=True, slots=True)
class Release(Message):
    KIND: ClassVar[Kind] = Kind.RELEASE
    FIELDS = (("claim", "u64"),)
    claim: int


@dataclass(frozen=True, slots=True)
class StatsReply(Message):
    KIND: ClassVar[Kind] = Kind.STATS_REPLY
    FIELDS = (("text", "json"),)
    text: str


@dataclass(frozen=True, slots=True)
class Probe(Message):
    KIND: ClassVar[Kind] = Kind.PROBE
    FIELDS = (("pool", "u32"), ("tag_base", "u64"), ("nbytes", "u64"))
    pool: int
    tag_base: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class Ping(Message):
    KIND: ClassVar[Kind] = Kind.PING


@dataclass(frozen=True, slots=True)
class Pong(Message):
    KIND: ClassVar[Kind] = Kind.PONG
