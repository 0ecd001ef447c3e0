"""Transfers: the reads and writes one client has in flight on the server (engine thread).

A read is a claim (CLAIM), then sends from the claimed slots (SEND) that release the claim
when they complete; a claim whose SEND does not come within ``op_timeout_s`` is released. A
write is a reservation whose receives are posted before RESERVED goes out, committed when
both the receives completed and the client's COMMIT says what it sent. See
:mod:`kvcr_policy.backends.peer.session` for when the slots are let go if the session ends.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvcr_policy.errors import CapacityError, KVCRPolicyError, PoolError
from kvcr_policy.geometry import PoolGeometry, check_pages

from ..dram.store import Claim as StoreClaim
from ..dram.store import Reservation
from . import messages as m
from .engine import RequestGroup, Timer
from .plan import WirePlan, page_outcome, wire_plan
from .tiers import Tier

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Attachment", "Transfers"]

log = logging.getLogger("kvcr_policy.backends.peer.server")

MAX_OPEN = 1024  # claims + reservations one client may hold at once
_TAG_LIMIT = 1 << 64


@dataclass(slots=True)
class Attachment:
    """A pool a client attached: the tier, the client's geometry and the negotiated plan."""

    tier: Tier
    client: PoolGeometry
    merge: bool
    split: int


@dataclass(slots=True)
class _Read:
    pool: Attachment
    claim: StoreClaim
    pages: np.ndarray
    timer: Timer
    sending: bool = False


@dataclass(slots=True)
class _Write:
    pool: Attachment
    reservation: Reservation
    todo: np.ndarray
    request: int
    timer: Timer
    arrived: np.ndarray | None = None  # per todo key, once the receives completed
    client_ok: np.ndarray | None = None  # per covered key, from COMMIT


class Transfers:
    """Claims and reservations of one session; ``busy`` while any, or any request, is open."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.reads: dict[int, _Read] = {}
        self.writes: dict[int, _Write] = {}
        self.groups = 0
        self._sending: set[RequestGroup] = set()
        self._ids = itertools.count(1)

    @property
    def busy(self) -> bool:
        return bool(self.reads or self.writes or self.groups)

    def close(self) -> None:
        """The session ended and its endpoint is closed: let go of what can be let go now.

        Claims not yet sending are released; sends are abandoned (the client let go of our
        memory: it closed its socket after cancelling, or died), which releases their claims;
        reservations are aborted once their receives completed (the endpoint's close
        cancelled them), since a receive may still write into its slot until then.
        """
        for number, read in list(self.reads.items()):
            if not read.sending:
                self._release(number)
        for number, write in list(self.writes.items()):
            if write.arrived is not None:
                self._abort_write(number, write)
        for group in list(self._sending):
            self.session.engine.abandon(group)

    def claim(self, msg: m.Claim, request: int) -> None:
        pool = self.session.pool(msg.pool)
        pages = check_pages(pool.client, msg.pages)
        if len(self.reads) + len(self.writes) >= MAX_OPEN:
            raise CapacityError(f"a connection may hold at most {MAX_OPEN} claims/reservations")
        claim = pool.tier.store.claim(msg.keys)
        if len(claim.slots) == 0:
            pool.tier.store.release(claim)
            self.session.channel.send(m.Claimed(0, claim.slots), request)
            return
        number = next(self._ids)
        timer = self.session.engine.later(
            self.session.server.op_timeout_s, lambda: self._expire(number)
        )
        self.reads[number] = _Read(pool, claim, pages[: len(claim.slots)], timer)
        self.session.channel.send(m.Claimed(number, claim.slots), request)

    def send(self, msg: m.Send, request: int) -> None:
        read = self.reads.get(msg.handle)
        if read is None or read.sending:
            self.session.abort(m.Err.BAD_REQUEST, f"SEND names no open claim ({msg.handle})")
            return
        pool = read.pool
        plan = wire_plan(
            pool.tier.geometry,
            read.claim.slots,
            pool.client,
            read.pages,
            merge=pool.merge,
            split_bytes=pool.split,
        )
        try:
            plan.check(msg.count, msg.nbytes, msg.digest, "the client")
            if msg.tag_base + plan.count > _TAG_LIMIT:
                raise PoolError(f"tag base {msg.tag_base} leaves no room for {plan.count} tags")
        except KVCRPolicyError as err:
            self._release(msg.handle)
            self.session.abort(m.Err.BAD_REQUEST, str(err))
            return
        read.sending = True
        read.timer.cancel()
        read.timer = self.session.deadline("sending a read")
        number = msg.handle
        self._transfer(
            pool.tier, plan, msg.tag_base, True, lambda failed: self._sent(number, request, failed)
        )

    def _sent(self, number: int, request: int, failed: np.ndarray) -> None:
        if self._release(number):
            self.session.channel.send(m.Sent(number, not failed.any()), request)
            self.session.close_if_drained()

    def _expire(self, number: int) -> None:
        read = self.reads.get(number)
        if read is not None and not read.sending:
            log.warning(
                "client %s: claim %d expired before SEND; released", self.session.peer, number
            )
            self._release(number)
            self.session.close_if_drained()

    def _release(self, number: int) -> bool:
        read = self.reads.pop(number, None)
        if read is None:
            return False
        read.timer.cancel()
        read.pool.tier.store.release(read.claim)
        return True

    def release_message(self, msg: m.Release, request: int) -> None:
        read = self.reads.get(msg.claim)
        if read is not None and not read.sending:
            self._release(msg.claim)
            self.session.close_if_drained()

    def reserve(self, msg: m.Reserve, request: int) -> None:
        pool = self.session.pool(msg.pool)
        pages = check_pages(pool.client, msg.pages)
        if len(self.reads) + len(self.writes) >= MAX_OPEN:
            raise CapacityError(f"a connection may hold at most {MAX_OPEN} claims/reservations")
        reservation = pool.tier.store.reserve(msg.keys)
        covered = len(reservation.keys)
        todo = np.flatnonzero(reservation.slots >= 0)
        plan = wire_plan(
            pool.client,
            pages[:covered][todo],
            pool.tier.geometry,
            reservation.slots[todo],
            merge=pool.merge,
            split_bytes=pool.split,
        )
        number = next(self._ids)
        write = _Write(pool, reservation, todo, request, self.session.deadline("a write"))
        self.writes[number] = write
        tag_base = self.session.engine.tags(plan.count)
        self._transfer(
            pool.tier, plan, tag_base, False, lambda failed: self._arrived(number, plan, failed)
        )
        reply_plan = m.Plan(number, tag_base, plan.count, plan.nbytes, plan.digest)
        self.session.channel.send(m.Reserved(number, reservation.slots, reply_plan), request)

    def _arrived(self, number: int, plan: WirePlan, failed: np.ndarray) -> None:
        write = self.writes.get(number)
        if write is None:
            return
        write.arrived = page_outcome(plan.descriptors, failed, len(write.todo))
        if self.session.state == "closed":
            self._abort_write(number, write)
        else:
            self._settle(number, write)

    def commit(self, msg: m.Commit, request: int) -> None:
        write = self.writes.get(msg.reservation)
        if write is None or write.client_ok is not None:
            self.session.abort(
                m.Err.BAD_REQUEST, f"COMMIT names no open reservation ({msg.reservation})"
            )
            return
        if len(msg.ok) != len(write.reservation.keys):
            self.session.abort(m.Err.BAD_REQUEST, "COMMIT must carry one flag per reserved key")
            return
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
        self.session.channel.send(m.Written(number, ok), write.request)
        self.session.close_if_drained()

    def _abort_write(self, number: int, write: _Write) -> None:
        write.timer.cancel()
        self.writes.pop(number, None)
        write.pool.tier.store.abort(write.reservation)

    def _transfer(self, tier: Tier, plan: WirePlan, tag_base: int, send: bool, done: Any) -> None:
        d = plan.descriptors
        offsets = (d.src if send else d.dst).tolist()
        view = tier.view
        assert view is not None and self.session.ep is not None
        group = self._group(send, done)
        for i, (offset, length) in enumerate(zip(offsets, d.length.tolist(), strict=True)):
            self.session.engine.post(
                group, self.session.ep, send, view[offset : offset + length], tag_base + i
            )
        self.session.engine.track(group)

    def _group(self, send: bool, done: Any) -> RequestGroup:
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
        view = self.session.pool(msg.pool).tier.view
        assert view is not None and self.session.ep is not None
        if not 0 < msg.nbytes <= len(view) or msg.tag_base + 1 > _TAG_LIMIT:
            raise PoolError(f"PROBE of {msg.nbytes} bytes: the tier holds {len(view)}")
        deadline = self.session.deadline("a probe")

        def finished(failed: np.ndarray) -> None:
            deadline.cancel()
            self.session.channel.send(m.Sent(0, not failed.any()), request)
            self.session.close_if_drained()

        group = self._group(True, finished)
        self.session.engine.post(group, self.session.ep, True, view[: msg.nbytes], msg.tag_base)
        self.session.engine.track(group)
