"""Transfers: the reads and writes one client has in flight on the server (worker thread).

A read is a claim (CLAIM), then sends from the claimed slots (SEND) that release the claim when
they complete; a claim whose SEND does not come within ``op_timeout_s`` is released. A write is
a reservation (RESERVE), then receives posted into the reserved slots (POST), committed when
both the receives completed and the client's COMMIT says what it sent. Each step waits at most
``op_timeout_s`` for the client's next request, and the sends or receives themselves are cut
only once their messages stopped completing for ``op_timeout_s`` (a :class:`~..requests.Stall`):
a busy host makes a transfer slower, never failed.

SEND and POST name the client's shaped descriptors by their tier bytes; nothing is sent or
posted unless they cover exactly the claimed or reserved slots in shapes this server accepts
(:class:`~..wire.coverage.Cover`); otherwise the request gets an ERROR and its claim or
reservation is let go. See :mod:`.session` for when slots are let go if the session ends.

A client that dies in the middle of a write over shared memory leaves receives posted into
its reserved slots that never complete (no error handling on those endpoints; UCX cannot
cancel a receive it already matched). Once the session is gone they are given
``op_timeout_s``; after that the receives are forsaken and the reservation is aborted, logged.
The session's UCX worker (its :class:`~..link.Link`, which only that client could reach) is
then frozen, never progressed again, so no byte can land in those slots any more: they go
back to the tier instead of leaking.

**Shared-memory sessions** (a same-host client on the server's Unix socket, ``tls`` shm) move
no UCX message: the client maps the tier and copies pages itself. A read is CLAIM, the
client's copy out of the claimed slots, then COPIED, answered SENT ``ok`` only if the claim
was still held (an expired one may have been overwritten: the client counts those pages as
missed). A write is RESERVE, the client's copy into the reserved slots, then COMMIT (no
POST). A shared-memory session that ends with reservations open hands them to the server's
:class:`~.quarantine.Quarantine`: the client may still be copying into them, so they are
freed only once its process has exited.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import numpy as np

from kvcr_policy.errors import CapacityError, PoolError, ProtocolError
from kvcr_policy.geometry import PoolGeometry, check_pages

from ...dram.store import Claim as StoreClaim
from ...dram.store import Reservation
from ..channel import Channel
from ..link import Link
from ..requests import RequestGroup, Stall, Timer, message_limit
from ..wire import messages as m
from ..wire.coverage import Cover
from ..worker import Worker
from .quarantine import Held
from .tiers import Tier

__all__ = ["Attachment", "Owner", "Transfers"]

log = logging.getLogger("kvcr_policy.backends.peer.server")

MAX_OPEN = 1024  # claims + reservations one client may hold at once
_TAG_LIMIT = 1 << 64


@dataclass(slots=True)
class Attachment:
    """A pool a client attached: the tier and the client's geometry."""

    tier: Tier
    client: PoolGeometry


class Owner(Protocol):
    """What transfers need from the session that holds them."""

    worker: Worker
    link: Link | None
    channel: Channel
    ep: Any
    state: str
    peer: str
    tls: str
    op_timeout_s: float
    accepts: frozenset[str]

    def pool(self, number: int) -> Attachment: ...

    def deadline(self, what: str, limit: float | None = None) -> Timer: ...

    def stall(self, what: str, group: RequestGroup) -> Stall: ...

    def abort(self, code: int, text: str) -> None: ...

    def close_if_drained(self) -> None: ...

    def hold(self, items: list[Held]) -> None: ...


@dataclass(slots=True)
class _Read:
    pool: Attachment
    claim: StoreClaim
    timer: Timer | Stall
    sending: bool = False


@dataclass(slots=True)
class _Write:
    pool: Attachment
    reservation: Reservation
    todo: np.ndarray  # positions of the covered keys that have a slot
    request: int
    timer: Timer | Stall
    posted: bool = False
    group: RequestGroup | None = None  # the receives, once posted
    arrived: np.ndarray | None = None  # per todo key, once the receives completed
    client_ok: np.ndarray | None = None  # per covered key, from COMMIT


#: Set calls a session remembers the keys of (RESERVE ``call``), most recent first, and the
#: most keys remembered per call: a session's memory for them stays bounded whatever it sends.
CALLS_KEPT = 4
CALL_KEYS = 16384


class Transfers:
    """Claims and reservations of one session; ``busy`` while any, or any request, is open."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.reads: dict[int, _Read] = {}
        self.writes: dict[int, _Write] = {}
        self.groups = 0
        self._sending: set[RequestGroup] = set()
        self._ids = itertools.count(1)
        self._calls: OrderedDict[int, set[str]] = OrderedDict()

    @property
    def receiving(self) -> int:
        """Writes whose receives are posted and not yet complete."""
        return sum(1 for w in self.writes.values() if w.posted and w.arrived is None and w.group)

    @property
    def busy(self) -> bool:
        return bool(self.reads or self.writes or self.groups)

    def close(self) -> None:
        """The session ended and its endpoint is closed: let go of what can be let go now.

        Claims not yet sending are released; sends are abandoned (the client let go of our
        memory: it closed its socket after cancelling, or died), which releases their claims;
        reservations are aborted unless receives are still posted into them (the endpoint's
        close cancelled them; a receive may write into its slot until it completes).
        """
        claims, aborted, waiting = 0, 0, 0
        for number, read in list(self.reads.items()):
            if not read.sending:
                claims += self._release(number)
        if self.owner.tls == "shm":
            self._quarantine()
        for number, write in list(self.writes.items()):
            if not write.posted or write.arrived is not None:
                self._abort_write(number, write)
                aborted += 1
            else:
                waiting += 1
                limit = self.owner.op_timeout_s
                self.owner.worker.later(limit, partial(self._forsake, number, limit))
        sending = len(self._sending)
        for group in list(self._sending):
            self._link().abandon(group)
        if claims or aborted or waiting or sending:
            log.info(
                "client %s gone: released %d claims (%d more whose sends were abandoned), "
                "aborted %d reservations; %d with receives still posted get %s s",
                self.owner.peer,
                claims,
                sending,
                aborted,
                waiting,
                self.owner.op_timeout_s,
            )

    def _quarantine(self) -> None:
        """A shared-memory session ended: its open reservations go to the quarantine (the
        client's copies into them may still be running; see the module docstring)."""
        held: list[Held] = []
        for number, write in list(self.writes.items()):
            write.timer.cancel()
            del self.writes[number]
            store, reservation = write.pool.tier.store, write.reservation
            if len(write.todo) == 0:
                store.abort(reservation)
                continue
            held.append(Held(partial(store.abort, reservation), len(write.todo)))
        if held:
            self.owner.hold(held)

    def _forsake(self, number: int, limit: float) -> None:
        """The session ended ``limit`` seconds ago and this write's receives are still posted:
        the client is gone for good (see the module docstring); give its slots back."""
        write = self.writes.get(number)
        if write is None or write.group is None:
            return
        log.warning(
            "client %s: write %d still had receives posted %s s after the session ended (the "
            "client died mid-transfer); released its reservation of %d slots",
            self.owner.peer,
            number,
            limit,
            len(write.todo),
        )
        self._link().abandon(write.group)  # finishes the group: _arrived aborts the write

    def _check_open(self) -> None:
        if len(self.reads) + len(self.writes) >= MAX_OPEN:
            raise CapacityError(f"a connection may hold at most {MAX_OPEN} claims/reservations")

    # ---- reads ----------------------------------------------------------------------------

    def claim(self, msg: m.Claim, request: int) -> None:
        pool = self.owner.pool(msg.pool)
        check_pages(pool.client, msg.pages)
        self._check_open()
        claim = pool.tier.store.claim(msg.keys)
        if len(claim.slots) == 0:
            pool.tier.store.release(claim)
            self.owner.channel.send(m.Claimed(0, claim.slots), request)
            return
        number = next(self._ids)
        timer = self.owner.worker.later(self.owner.op_timeout_s, lambda: self._expire(number))
        self.reads[number] = _Read(pool, claim, timer)
        self.owner.channel.send(m.Claimed(number, claim.slots), request)

    def _no_messages(self, kind: str) -> bool:
        """A shared-memory session moves no UCX messages: SEND, POST and PROBE end it."""
        if self.owner.tls != "shm":
            return False
        text = f"{kind} on a shared-memory session (pages move by memory copy there)"
        self.owner.abort(m.Err.BAD_REQUEST, text)
        return True

    def copied(self, msg: m.Copied, request: int) -> None:
        """A shared-memory read's copy is done: release the claim, say whether it held."""
        if self.owner.tls != "shm":
            self.owner.abort(m.Err.BAD_REQUEST, "COPIED on a session that moves UCX messages")
            return
        read = self.reads.get(msg.handle)
        held = read is not None and not read.sending
        if held:
            self._release(msg.handle)
        self.owner.channel.send(m.Sent(msg.handle, held), request)
        self.owner.close_if_drained()

    def send(self, msg: m.Send, request: int) -> None:
        if self._no_messages("SEND"):
            return
        read = self.reads.get(msg.claim)
        if read is None or read.sending:
            self.owner.abort(m.Err.BAD_REQUEST, f"SEND names no open claim ({msg.claim})")
            return
        tier = read.pool.tier
        try:
            Cover.of_pages(tier.geometry, read.claim.slots).check(
                msg.offsets, msg.lengths, accepts=self.owner.accepts, what=f"SEND {msg.claim}"
            )
            if msg.tag_base + len(msg.offsets) > _TAG_LIMIT:
                message = f"tag base {msg.tag_base} leaves no room for {len(msg.offsets)} tags"
                raise ProtocolError(message)
        except ProtocolError as err:
            self._release(msg.claim)
            self._refuse(request, err)
            return
        read.sending = True
        read.timer.cancel()
        number = msg.claim
        group = self._transfer(
            tier,
            msg.offsets,
            msg.lengths,
            msg.tag_base,
            True,
            lambda failed: self._sent(number, request, failed),
        )
        read.timer = self.owner.stall("sending a read", group)

    def _sent(self, number: int, request: int, failed: np.ndarray) -> None:
        if self._release(number):
            self.owner.channel.send(m.Sent(number, not failed.any()), request)
            self.owner.close_if_drained()

    def _expire(self, number: int) -> None:
        read = self.reads.get(number)
        if read is not None and not read.sending:
            what = "COPIED" if self.owner.tls == "shm" else "SEND"
            log.warning(
                "client %s: claim %d expired before %s; released", self.owner.peer, number, what
            )
            self._release(number)
            self.owner.close_if_drained()

    def _release(self, number: int) -> bool:
        read = self.reads.pop(number, None)
        if read is None:
            return False
        read.timer.cancel()
        read.pool.tier.store.release(read.claim)
        return True

    def release_message(self, msg: m.Release, request: int) -> None:
        read = self.reads.get(msg.handle)
        if read is not None and not read.sending:
            self._release(msg.handle)
        write = self.writes.get(msg.handle)
        if write is not None and not write.posted:
            self._abort_write(msg.handle, write)
        self.owner.close_if_drained()

    # ---- writes ---------------------------------------------------------------------------

    def reserve(self, msg: m.Reserve, request: int) -> None:
        pool = self.owner.pool(msg.pool)
        check_pages(pool.client, msg.pages)
        self._check_open()
        reservation = pool.tier.store.reserve(msg.keys, self._call_keys(msg))
        todo = np.flatnonzero(reservation.slots >= 0)
        number = next(self._ids)
        write = _Write(pool, reservation, todo, request, self.owner.deadline("a write"))
        if len(todo) == 0:  # nothing to receive: COMMIT follows at once
            write.posted, write.arrived = True, np.zeros(0, dtype=bool)
        self.writes[number] = write
        self.owner.channel.send(m.Reserved(number, reservation.slots), request)

    def _call_keys(self, msg: m.Reserve) -> set[str] | list[str]:
        """The keys no batch of ``msg``'s call may evict: those its first batch named and those
        of the call's batches so far (this one's included, for the next)."""
        if msg.call == 0:
            return msg.keep
        kept = self._calls.pop(msg.call, None)
        if kept is None:
            kept = set()
            while len(self._calls) >= CALLS_KEPT:
                self._calls.popitem(last=False)
        self._calls[msg.call] = kept
        for keys in (msg.keep, msg.keys):
            room = CALL_KEYS - len(kept)
            kept.update(keys if len(keys) <= room else keys[:room])
        return kept

    def post(self, msg: m.Post, request: int) -> None:
        if self._no_messages("POST"):
            return
        number = msg.reservation
        write = self.writes.get(number)
        if write is None or write.posted:
            self.owner.abort(m.Err.BAD_REQUEST, f"POST names no open reservation ({number})")
            return
        tier = write.pool.tier
        cover = Cover.of_pages(tier.geometry, write.reservation.slots[write.todo])
        try:
            cover.check(msg.offsets, msg.lengths, accepts=self.owner.accepts, what=f"POST {number}")
        except ProtocolError as err:
            self._abort_write(number, write)
            self._refuse(request, err)
            return
        write.posted = True
        tag_base = self._link().tags(len(msg.offsets))
        offsets, lengths = msg.offsets, msg.lengths

        def arrived(failed: np.ndarray) -> None:
            self._arrived(number, cover.outcome(offsets, lengths, failed))

        write.group = self._transfer(tier, offsets, lengths, tag_base, False, arrived)
        write.timer.cancel()
        write.timer = self.owner.stall("receiving a write", write.group)
        self.owner.channel.send(m.Posted(number, tag_base), request)

    def _arrived(self, number: int, ok: np.ndarray) -> None:
        write = self.writes.get(number)
        if write is None:
            return
        write.arrived = ok
        write.timer.cancel()
        if self.owner.state == "closed":
            self._abort_write(number, write)
            return
        if write.client_ok is None:
            write.timer = self.owner.deadline("a write's COMMIT")
        self._settle(number, write)

    def commit(self, msg: m.Commit, request: int) -> None:
        write = self.writes.get(msg.reservation)
        if write is None or write.client_ok is not None:
            self.owner.abort(
                m.Err.BAD_REQUEST, f"COMMIT names no open reservation ({msg.reservation})"
            )
            return
        if len(msg.ok) != len(write.reservation.keys):
            self.owner.abort(m.Err.BAD_REQUEST, "COMMIT must carry one flag per reserved key")
            return
        if self.owner.tls == "shm" and not write.posted:
            # The client copied into the slots itself: what it says arrived, arrived.
            write.posted, write.arrived = True, np.ones(len(write.todo), dtype=bool)
        write.client_ok = msg.ok
        write.request = request
        self._settle(msg.reservation, write)

    def _settle(self, number: int, write: _Write) -> None:
        if write.arrived is None or write.client_ok is None:
            return
        res = write.reservation
        ok = np.zeros(len(res.keys), dtype=bool)
        ok[write.todo] = write.arrived & write.client_ok[write.todo]
        write.timer.cancel()
        del self.writes[number]
        write.pool.tier.store.commit(res, ok.tolist())
        ok |= np.asarray(res.present, dtype=bool)
        self.owner.channel.send(m.Written(number, ok), write.request)
        self.owner.close_if_drained()

    def _abort_write(self, number: int, write: _Write) -> None:
        write.timer.cancel()
        self.writes.pop(number, None)
        write.pool.tier.store.abort(write.reservation)

    # ---- moving bytes ---------------------------------------------------------------------

    def _refuse(self, request: int, err: Exception) -> None:
        log.warning("client %s: %s", self.owner.peer, err)
        self.owner.channel.send(m.Error(m.Err.BAD_REQUEST, str(err)), request)
        self.owner.close_if_drained()

    def _transfer(
        self,
        tier: Tier,
        offsets: np.ndarray,
        lengths: np.ndarray,
        tag_base: int,
        send: bool,
        done: Callable[[np.ndarray], None],
    ) -> RequestGroup:
        """One message per descriptor, ``tag_base + i``, straight from or into the tier."""
        view = tier.view
        assert view is not None and self.owner.ep is not None
        link, ep = self._link(), self.owner.ep
        group = self._group(send, done)
        for i, (offset, length) in enumerate(zip(offsets.tolist(), lengths.tolist(), strict=True)):
            link.post(group, ep, send, view[offset : offset + length], tag_base + i)
        link.track(group)
        return group

    def _link(self) -> Link:
        link = self.owner.link
        assert link is not None, "transfers run only on a session that said WELCOME"
        return link

    def _group(self, send: bool, done: Callable[[np.ndarray], None]) -> RequestGroup:
        self.groups += 1

        def finished(failed: np.ndarray) -> None:
            self.groups -= 1
            self._sending.discard(group)
            done(failed)

        group = RequestGroup(finished, sending=send)
        if send:
            self._sending.add(group)
        return group

    def probe(self, msg: m.Probe, request: int) -> None:
        if self._no_messages("PROBE"):
            return
        view = self.owner.pool(msg.pool).tier.view
        assert view is not None and self.owner.ep is not None
        if not 0 < msg.nbytes <= len(view) or msg.tag_base + 1 > _TAG_LIMIT:
            raise PoolError(f"PROBE of {msg.nbytes} bytes: the tier holds {len(view)}")
        deadline = self.owner.deadline(
            "a probe", message_limit(self.owner.op_timeout_s, msg.nbytes)
        )

        def finished(failed: np.ndarray) -> None:
            deadline.cancel()
            self.owner.channel.send(m.Sent(0, not failed.any()), request)
            self.owner.close_if_drained()

        group = self._group(True, finished)
        self._link().post(group, self.owner.ep, True, view[: msg.nbytes], msg.tag_base)
        self._link().track(group)
