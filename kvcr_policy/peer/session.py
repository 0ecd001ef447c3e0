"""Session: the server side of one client connection (engine thread only).

A session owns what its client holds on the server: attached pools, claims (a read in flight)
and reservations (a write in flight), each with a deadline. Whatever way the session ends,
every claim is released and every reservation aborted, but only once UCX can no longer
touch the slots: after the session's endpoint is closed and its requests completed, and,
when the server ends the session, after the client closed its side (or a linger timeout).
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import CapacityError, KVCRPolicyError, PoolError, UnsupportedError
from ..geometry import Layout, PoolGeometry, check_pages
from ..store import Claim as StoreClaim
from ..store import Reservation
from . import messages as m
from .channel import Channel
from .engine import RequestGroup, Timer
from .plan import WirePlan, page_outcome, wire_plan
from .tiers import Tier

if TYPE_CHECKING:
    from .server import PeerServer

__all__ = ["Session"]

log = logging.getLogger("kvcr_policy.peer.server")

MAX_ATTACHED = 64
MAX_OPEN = 1024  # claims + reservations one client may hold at once
_TAG_LIMIT = 1 << 64


@dataclass(slots=True)
class _Pool:
    tier: Tier
    client: PoolGeometry
    merge: bool
    split: int


@dataclass(slots=True)
class _Read:
    pool: _Pool
    claim: StoreClaim
    pages: np.ndarray
    timer: Timer
    sending: bool = False


@dataclass(slots=True)
class _Write:
    pool: _Pool
    reservation: Reservation
    todo: np.ndarray
    request: int
    timer: Timer
    arrived: np.ndarray | None = None  # per todo key, once the receives completed
    client_ok: np.ndarray | None = field(default=None)  # per covered key, from COMMIT


class Session:
    """See the module docstring; built by :class:`~kvcr_policy.peer.server.PeerServer`."""

    def __init__(self, server: PeerServer, sock: Any, peer: str) -> None:
        self.server = server
        self.engine = server.engine
        self.peer = peer
        self.ep: Any = None
        self.tls = ""
        self.state = "hello"  # hello -> checking -> ready -> draining -> closed
        self.heartbeat_s = 0.0
        self.pools: list[_Pool] = []
        self.reads: dict[int, _Read] = {}
        self.writes: dict[int, _Write] = {}
        self.groups = 0
        self._sending: set[RequestGroup] = set()
        self._ids = itertools.count(1)
        self._beat: Timer | None = None
        self.channel = Channel(
            self.engine,
            sock,
            name=f"client {peer}",
            on_message=self._on_message,
            on_closed=self._on_closed,
        )

    @property
    def busy(self) -> bool:
        return bool(self.reads or self.writes or self.groups)

    # ---- lifetime -------------------------------------------------------------------------

    def abort(self, code: int, text: str) -> None:
        """End the session from this side: tell the client, wait for it to let go, release."""
        if self.channel.closed or self.channel.lingering:
            return
        log.warning("client %s: %s; ending its session", self.peer, text)
        self.channel.send(m.Error(code, text))
        self.channel.linger(self.server.linger_s, text)

    def drain(self) -> None:
        """Server stopping: refuse new work; close once in-flight work is done."""
        if self.state in ("hello", "checking"):
            self.channel.close("server stopping")
        elif self.state == "ready":
            self.state = "draining"
            self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self.state == "draining" and not self.busy:
            self.channel.linger(min(1.0, self.server.linger_s), "server stopping")

    def _on_closed(self, reason: str) -> None:
        self.state = "closed"
        if self._beat is not None:
            self._beat.cancel()
        for number, read in list(self.reads.items()):
            if not read.sending:  # sending ones are released when their group completes
                self._release(number)
        for number, write in list(self.writes.items()):
            if write.arrived is not None:  # receives done; otherwise their group aborts it
                self._abort_write(number, write)
        if self.ep is not None:
            ep, self.ep = self.ep, None
            self.engine.close_endpoint(
                ep, self.tls == "tcp"
            )  # cancels receives; their groups then settle
        for group in list(self._sending):
            self.engine.abandon(group)  # the client let go of our memory (see Channel/linger)
        self.server.session_closed(self, reason)

    # ---- dispatch -------------------------------------------------------------------------

    def _on_message(self, message: m.Message, request: int) -> None:
        if self.state == "hello":
            if not isinstance(message, m.Hello):
                self.channel.fail(m.Err.PROTOCOL, f"expected HELLO first, got {message.KIND.name}")
                return
            self._hello(message, request)
            return
        if self.state == "checking":
            self.channel.fail(m.Err.PROTOCOL, "a request arrived before WELCOME")
            return
        handler = _HANDLERS.get(type(message))
        if handler is None:
            self.channel.fail(m.Err.PROTOCOL, f"{message.KIND.name} is not a client request")
            return
        if self.state == "draining" and type(message) not in _WHILE_DRAINING:
            self.channel.send(m.Error(m.Err.SHUTTING_DOWN, "the peer is shutting down"), request)
            return
        try:
            handler(self, message, request)
        except (PoolError, UnsupportedError) as err:
            code = m.Err.UNSUPPORTED if isinstance(err, UnsupportedError) else m.Err.BAD_REQUEST
            self.channel.send(m.Error(code, str(err)), request)
        except CapacityError as err:
            self.channel.send(m.Error(m.Err.CAPACITY, str(err)), request)
        except KVCRPolicyError as err:
            self.abort(m.Err.BAD_REQUEST, str(err))
        except Exception as err:  # a bug here must cost one session, never the server
            log.exception("client %s: %s failed", self.peer, message.KIND.name)
            self.abort(m.Err.INTERNAL, f"internal error: {type(err).__name__}: {err}")

    def _hello(self, hello: m.Hello, request: int) -> None:
        try:
            tls = self.server.choose_tls(hello)
        except UnsupportedError as err:
            self.channel.fail(m.Err.UNSUPPORTED, str(err))
            return
        self.state = "checking"
        self.tls = tls
        self.heartbeat_s = min(hello.heartbeat_ms, 600_000) / 1000
        self.server.check_address(
            hello.address, tls == "tcp", lambda ok: self._welcome(ok, hello, request)
        )

    def _welcome(self, ok: bool, hello: m.Hello, request: int) -> None:
        if self.channel.closed:
            return
        if not ok:
            self.channel.fail(m.Err.BAD_REQUEST, "the UCX worker address in HELLO is not usable")
            return
        ucx = self.engine.ucx
        try:
            address = ucx.UCXAddress.create_from_buffer(hello.address)
            self.ep = ucx.UCXEndpoint.create_from_worker_address(
                self.engine.worker, address, self.tls == "tcp"
            )
        except Exception as err:
            self.channel.fail(m.Err.BAD_REQUEST, f"cannot reach the client over UCX: {err}")
            return
        self.state = "ready"
        tls_code = 1 if self.tls == "sm" else 2
        welcome = m.Welcome(
            self.server.capabilities_mask,
            tls_code,
            self.server.server_id,
            self.server.host_id,
            self.engine.address,
        )
        self.channel.send(welcome, request)
        log.info("client %s connected (%s, tls %s)", self.peer, hello.name or "?", self.tls)
        if self.heartbeat_s > 0:
            self._beat = self.engine.later(self.heartbeat_s, self._check_alive)

    def _check_alive(self) -> None:
        if self.channel.closed or self.channel.lingering:
            return
        silent = time.monotonic() - self.channel.last_recv
        if silent > 3 * self.heartbeat_s + 1.0:
            self.abort(m.Err.TIMEOUT, f"client silent for {silent:.1f} s")
            return
        self._beat = self.engine.later(self.heartbeat_s, self._check_alive)

    def _pool(self, number: int) -> _Pool:
        if number >= len(self.pools):
            raise PoolError(f"no attached pool number {number} (attached: {len(self.pools)})")
        return self.pools[number]

    def _deadline(self, what: str) -> Timer:
        timeout = self.server.op_timeout_s
        return self.engine.later(
            timeout, lambda: self.abort(m.Err.TIMEOUT, f"{what} exceeded {timeout} s")
        )

    # ---- handlers -------------------------------------------------------------------------

    def _attach(self, msg: m.Attach, request: int) -> None:
        if len(self.pools) >= MAX_ATTACHED:
            raise CapacityError(f"a connection may attach at most {MAX_ATTACHED} pools")
        client = PoolGeometry(
            name=msg.name,
            layout=cast(Layout, msg.layout),  # PoolGeometry refuses an unknown one
            layers=msg.layers,
            heads=msg.heads,
            head_dim=msg.head_dim,
            dtype=msg.dtype,
            page_size=msg.page_size,
            tokens=msg.tokens,
            mla=msg.mla,
        )
        if client.nbytes > 1 << 50:
            raise PoolError(f"pool {msg.name!r} of {client.nbytes} bytes is not plausible")
        asked = [c for c, on in (("coalesce", msg.coalesce), ("split", msg.split_bytes)) if on]
        missing = [c for c in asked if c not in self.server.capabilities]
        if missing:
            raise UnsupportedError(f"this peer does not {' or '.join(missing)} descriptors")
        tier = self.server.tiers.open(client)
        self.pools.append(_Pool(tier, client, msg.coalesce, int(msg.split_bytes)))
        self.channel.send(m.Attached(len(self.pools) - 1, tier.slots), request)

    def _exists(self, msg: m.Exists, request: int) -> None:
        store = self._pool(msg.pool).tier.store
        self.channel.send(m.Count(store.contains_prefix(msg.keys)), request)

    def _claim(self, msg: m.Claim, request: int) -> None:
        pool = self._pool(msg.pool)
        pages = check_pages(pool.client, msg.pages)
        if len(self.reads) + len(self.writes) >= MAX_OPEN:
            raise CapacityError(f"a connection may hold at most {MAX_OPEN} claims/reservations")
        claim = pool.tier.store.claim(msg.keys)
        if len(claim.slots) == 0:
            pool.tier.store.release(claim)
            self.channel.send(m.Claimed(0, claim.slots), request)
            return
        number = next(self._ids)
        timer = self.engine.later(self.server.op_timeout_s, lambda: self._expire(number))
        self.reads[number] = _Read(pool, claim, pages[: len(claim.slots)], timer)
        self.channel.send(m.Claimed(number, claim.slots), request)

    def _send(self, msg: m.Send, request: int) -> None:
        read = self.reads.get(msg.handle)
        if read is None or read.sending:
            self.abort(m.Err.BAD_REQUEST, f"SEND names no open claim ({msg.handle})")
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
            self.abort(m.Err.BAD_REQUEST, str(err))
            return
        read.sending = True
        read.timer.cancel()
        read.timer = self._deadline("sending a read")
        number = msg.handle
        self._transfer(
            pool.tier, plan, msg.tag_base, True, lambda failed: self._sent(number, request, failed)
        )

    def _sent(self, number: int, request: int, failed: np.ndarray) -> None:
        if self._release(number):
            self.channel.send(m.Sent(number, not failed.any()), request)
            self._close_if_drained()

    def _expire(self, number: int) -> None:
        read = self.reads.get(number)
        if read is not None and not read.sending:
            log.warning("client %s: claim %d expired before SEND; released", self.peer, number)
            self._release(number)
            self._close_if_drained()

    def _release(self, number: int) -> bool:
        read = self.reads.pop(number, None)
        if read is None:
            return False
        read.timer.cancel()
        read.pool.tier.store.release(read.claim)
        return True

    def _release_msg(self, msg: m.Release, request: int) -> None:
        read = self.reads.get(msg.claim)
        if read is not None and not read.sending:
            self._release(msg.claim)
            self._close_if_drained()

    def _reserve(self, msg: m.Reserve, request: int) -> None:
        pool = self._pool(msg.pool)
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
        write = _Write(pool, reservation, todo, request, self._deadline("a write"))
        self.writes[number] = write
        tag_base = self.engine.tags(plan.count)
        self._transfer(
            pool.tier, plan, tag_base, False, lambda failed: self._arrived(number, plan, failed)
        )
        reply_plan = m.Plan(number, tag_base, plan.count, plan.nbytes, plan.digest)
        self.channel.send(m.Reserved(number, reservation.slots, reply_plan), request)

    def _arrived(self, number: int, plan: WirePlan, failed: np.ndarray) -> None:
        write = self.writes.get(number)
        if write is None:
            return
        write.arrived = page_outcome(plan.descriptors, failed, len(write.todo))
        if self.state == "closed":
            self._abort_write(number, write)
        else:
            self._settle(number, write)

    def _commit(self, msg: m.Commit, request: int) -> None:
        write = self.writes.get(msg.reservation)
        if write is None or write.client_ok is not None:
            self.abort(m.Err.BAD_REQUEST, f"COMMIT names no open reservation ({msg.reservation})")
            return
        if len(msg.ok) != len(write.reservation.keys):
            self.abort(m.Err.BAD_REQUEST, "COMMIT must carry one flag per reserved key")
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
        self.channel.send(m.Written(number, ok), write.request)
        self._close_if_drained()

    def _abort_write(self, number: int, write: _Write) -> None:
        write.timer.cancel()
        self.writes.pop(number, None)
        write.pool.tier.store.abort(write.reservation)

    def _transfer(self, tier: Tier, plan: WirePlan, tag_base: int, send: bool, done: Any) -> None:
        d = plan.descriptors
        offsets = (d.src if send else d.dst).tolist()
        view = tier.view
        assert view is not None and self.ep is not None
        group = self._group(send, done)
        for i, (offset, length) in enumerate(zip(offsets, d.length.tolist(), strict=True)):
            self.engine.post(group, self.ep, send, view[offset : offset + length], tag_base + i)
        self.engine.track(group)

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

    def _delete(self, msg: m.Delete, request: int) -> None:
        self.channel.send(m.Count(self._pool(msg.pool).tier.store.delete(msg.keys)), request)

    def _clear(self, msg: m.Clear, request: int) -> None:
        self.channel.send(m.Count(self._pool(msg.pool).tier.store.clear()), request)

    def _stats(self, msg: m.Stats, request: int) -> None:
        data = {"tier": self._pool(msg.pool).tier.stats(), "server": self.server.describe()}
        self.channel.send(m.StatsReply(json.dumps(data, default=str)), request)

    def _probe(self, msg: m.Probe, request: int) -> None:
        tier = self._pool(msg.pool).tier
        if not 0 < msg.nbytes <= tier.region.size or msg.tag_base + 1 > _TAG_LIMIT:
            raise PoolError(f"PROBE of {msg.nbytes} bytes: the tier holds {tier.region.size}")
        view = tier.view
        assert view is not None and self.ep is not None

        def finished(failed: np.ndarray) -> None:
            self.channel.send(m.Sent(0, not failed.any()), request)
            self._close_if_drained()

        group = self._group(True, finished)
        self.engine.post(group, self.ep, True, view[: msg.nbytes], msg.tag_base)
        self.engine.track(group)

    def _ping(self, msg: m.Ping, request: int) -> None:
        self.channel.send(m.Pong(), request)


_HANDLERS: dict[type, Any] = {
    m.Attach: Session._attach,
    m.Exists: Session._exists,
    m.Claim: Session._claim,
    m.Send: Session._send,
    m.Release: Session._release_msg,
    m.Reserve: Session._reserve,
    m.Commit: Session._commit,
    m.Delete: Session._delete,
    m.Clear: Session._clear,
    m.Stats: Session._stats,
    m.Probe: Session._probe,
    m.Ping: Session._ping,
}
_WHILE_DRAINING = {m.Send, m.Release, m.Commit, m.Ping, m.Stats}
