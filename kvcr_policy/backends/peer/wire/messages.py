"""The peer protocol's messages: one frozen value per type; its fields are its payload.

The conversation they make up is drawn in :mod:`kvcr_policy.backends.peer.wire`. Each field is
declared once, with its codec type (:mod:`.fields`); ``check`` refuses what decodes but cannot
be meant.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from kvcr_policy.errors import ProtocolError

from ..auth import KEY_ID_BYTES, NONCE_BYTES, PROOF_BYTES
from .fields import (
    U8,
    U16,
    U32,
    U64,
    Address,
    Bool,
    Flags,
    Int64s,
    Json,
    Keys,
    Name,
    Ranges,
    Short,
    Text,
    Token,
)
from .message import KINDS, Err, Kind, Message, decode, encode, message

__all__ = [
    "ALIGN_BYTES",
    "CAPABILITIES",
    "KINDS",
    "Attach",
    "Attached",
    "Auth",
    "Challenge",
    "Claim",
    "Claimed",
    "Clear",
    "Commit",
    "Copied",
    "Count",
    "Delete",
    "Err",
    "Error",
    "Exists",
    "Hello",
    "Kind",
    "Message",
    "Ping",
    "Pong",
    "Post",
    "Posted",
    "Probe",
    "Release",
    "Reserve",
    "Reserved",
    "Send",
    "Sent",
    "Stats",
    "StatsReply",
    "Welcome",
    "Written",
    "capability_mask",
    "capability_names",
    "decode",
    "encode",
]

#: Tier offsets mirror the pool's address modulo this (a 4 KiB page).
ALIGN_BYTES = 4096

#: Capability bits of HELLO and WELCOME. A server accepts ``shaped`` descriptor lists (SEND,
#: POST); ``coalesce``: descriptors spanning several fragments; ``split``: parts of fragments.
CAPABILITIES = {"coalesce": 1, "split": 2, "shaped": 4}


def capability_mask(names: Iterable[str]) -> int:
    return sum(CAPABILITIES[name] for name in set(names))


def capability_names(mask: int) -> frozenset[str]:
    return frozenset(name for name, bit in CAPABILITIES.items() if mask & bit)


def _sized(what: str, value: bytes, sizes: tuple[int, ...]) -> None:
    if len(value) not in sizes:
        expected = " or ".join(map(str, sizes))
        raise ProtocolError(f"{what} has {len(value)} bytes, expected {expected}")


@message(Kind.HELLO)
class Hello(Message):
    """The client's opening (see :mod:`..auth`): no UCX address yet, nothing costly to check."""

    capabilities: U32
    tls: U8  # 0 auto, 1 sm, 2 tcp, 3 shm (a same-host client on the server's Unix socket)
    heartbeat_ms: U32
    op_timeout_ms: U32
    host_id: Name
    name: Name
    key_id: Short  # empty: this client has no secret
    nonce: Short

    def check(self) -> None:
        if self.tls > 3:
            message = f"HELLO: tls {self.tls} is not 0 (auto), 1 (sm), 2 (tcp) or 3 (shm)"
            raise ProtocolError(message)
        _sized("HELLO: key_id", self.key_id, (0, KEY_ID_BYTES))
        _sized("HELLO: nonce", self.nonce, (NONCE_BYTES,))


@message(Kind.CHALLENGE)
class Challenge(Message):
    """The server's nonce and proof (none when it runs without authentication)."""

    insecure: Bool
    nonce: Short
    proof: Short

    def check(self) -> None:
        _sized("CHALLENGE: nonce", self.nonce, (NONCE_BYTES,))
        _sized("CHALLENGE: proof", self.proof, (0,) if self.insecure else (PROOF_BYTES,))


@message(Kind.AUTH)
class Auth(Message):
    """The client's proof, then its UCX worker address (checked only once the proof is)."""

    proof: Short
    address: Address

    def check(self) -> None:
        _sized("AUTH: proof", self.proof, (0, PROOF_BYTES))


@message(Kind.WELCOME)
class Welcome(Message):
    """The session is open. ``tls`` 3 (shm): pages move through the tier's shared memory (no
    UCX ``address``). ``local``: the Unix socket name of this server's shared-memory sessions,
    offered to a client on the same host over any other connection ("" when none)."""

    capabilities: U32
    tls: U8  # 1 sm, 2 tcp, 3 shm
    server_id: U64
    host_id: Name
    address: Address
    tenant: Name
    local: Name

    def check(self) -> None:
        if self.tls not in (1, 2, 3):
            raise ProtocolError(f"WELCOME: tls {self.tls} is not 1 (sm), 2 (tcp) or 3 (shm)")


@message(Kind.ERROR)
class Error(Message):
    code: U16
    text: Text


@message(Kind.ATTACH)
class Attach(Message):
    name: Name
    layout: Token
    layers: U32
    heads: U32
    head_dim: U32
    dtype: Token
    page_size: U32
    tokens: U64
    mla: Bool
    align: U32  # the pool's address modulo ALIGN_BYTES: the tier mirrors it (see server.tiers)

    def check(self) -> None:
        if self.align >= ALIGN_BYTES:
            raise ProtocolError(f"ATTACH: align {self.align} is not below {ALIGN_BYTES}")


@message(Kind.ATTACHED)
class Attached(Message):
    """The pool's number on the connection and its tier's slots. On a shared-memory session
    the tier's memfd travels with this frame (``SCM_RIGHTS``); its pages start ``shm_offset``
    bytes into it and span ``shm_bytes`` (0 on other sessions)."""

    pool: U32
    slots: U64
    shm_offset: U64
    shm_bytes: U64


@message(Kind.EXISTS)
class Exists(Message):
    pool: U32
    keys: Keys


@message(Kind.DELETE)
class Delete(Exists):
    pass


@message(Kind.CLEAR)
class Clear(Message):
    pool: U32


@message(Kind.STATS)
class Stats(Clear):
    pass


@message(Kind.COUNT)
class Count(Message):
    count: U64


@message(Kind.CLAIM)
class Claim(Message):
    """CLAIM and RESERVE: keys and the client pool pages they go to or come from."""

    pool: U32
    keys: Keys
    pages: Int64s

    def check(self) -> None:
        if len(self.pages) != len(self.keys):
            message = (
                f"{self.KIND.name}: {len(self.keys)} keys but {len(self.pages)} pages; "
                "expected one page per key"
            )
            raise ProtocolError(message)


@message(Kind.RESERVE)
class Reserve(Claim):
    """RESERVE: also ``call``, the client's number for the set this batch is part of (0: none),
    and ``keep``, that set's other keys (sent with its first batch only). No batch of a call
    evicts the present pages of ``keep`` or of the call's earlier batches (a set never evicts
    its own keys): the server remembers them for the call's later batches."""

    call: U64
    keep: Keys


@message(Kind.CLAIMED)
class Claimed(Message):
    claim: U64
    slots: Int64s


@message(Kind.RESERVED)
class Reserved(Message):
    """Slots per covered key (-1: nothing to write); nothing is posted yet."""

    reservation: U64
    slots: Int64s


def _pairs(kind: Kind, offsets: np.ndarray, lengths: np.ndarray) -> None:
    if len(offsets) != len(lengths):
        message = (
            f"{kind.name}: {len(offsets)} offsets but {len(lengths)} lengths; "
            "expected one of each per descriptor"
        )
        raise ProtocolError(message)


@message(Kind.SEND)
class Send(Message):
    """Send the claim's bytes: tier ``offsets[i]``, ``lengths[i]`` as message ``tag_base + i``."""

    claim: U64
    tag_base: U64
    offsets: Ranges
    lengths: Ranges

    def check(self) -> None:
        _pairs(self.KIND, self.offsets, self.lengths)


@message(Kind.POST)
class Post(Message):
    """Post receives into the reservation's slots: tier ``offsets[i]``, ``lengths[i]``."""

    reservation: U64
    offsets: Ranges
    lengths: Ranges

    def check(self) -> None:
        _pairs(self.KIND, self.offsets, self.lengths)


@message(Kind.POSTED)
class Posted(Message):
    """The receives are posted: descriptor ``i`` is awaited as message ``tag_base + i``."""

    reservation: U64
    tag_base: U64


@message(Kind.COMMIT)
class Commit(Message):
    """COMMIT and WRITTEN: a reservation and one flag per covered key."""

    reservation: U64
    ok: Flags


@message(Kind.WRITTEN)
class Written(Commit):
    pass


@message(Kind.SENT)
class Sent(Message):
    claim: U64
    ok: Bool


@message(Kind.RELEASE)
class Release(Message):
    """A claim the client will not read, or a reservation it will not write (before POST)."""

    handle: U64


@message(Kind.COPIED)
class Copied(Message):
    """Shared-memory read: the client copied claim ``handle``'s pages; the server releases the
    claim and answers SENT, ``ok`` only if the claim was still held (else the copy may have
    raced a newer occupant of a slot and the pages count as missed)."""

    handle: U64


@message(Kind.STATS_REPLY)
class StatsReply(Message):
    text: Json


@message(Kind.PROBE)
class Probe(Message):
    pool: U32
    tag_base: U64
    nbytes: U64


@message(Kind.PING)
class Ping(Message):
    pass


@message(Kind.PONG)
class Pong(Message):
    pass
