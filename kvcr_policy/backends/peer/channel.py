"""Channel: one framed, non-blocking control socket, driven by the worker thread's loop.

Inbound bytes are cut into frames by a bounded :class:`~.wire.framing.FrameReader`
and decoded; a malformed frame closes the channel with a log line (after a best-effort ERROR
frame). Outbound frames queue in a bounded outbox: a peer that stops reading is disconnected,
never allowed to grow our memory.

A server's channels also bound time and memory per frame: a frame must arrive whole within
``frame_timeout_s`` of its first byte (a peer that trickles bytes is closed at that deadline,
whatever it sends meanwhile), and the payload of a large frame is read only as the server-wide
:class:`Budget` grants bytes for it, charged before each read (small frames, and a large
frame's first ``free_payload`` bytes, are read ``free_payload`` bytes at a time). A frame the
budget refuses (or preempts) is dropped as it arrives and answered ERROR ``CAPACITY``; the
connection goes on. ``last_frame`` is when the last whole frame arrived: what a
peer's silence is measured from. ``waiting_since`` is when the first frame left after the last
bytes came in (None while nothing is awaited): how long the peer has left this side waiting.

On a Unix socket a frame may carry file descriptors (``send(..., fds=...)``: ``SCM_RIGHTS``
with the frame's first bytes; a server hands a same-host client its tier's memfd this way). A
channel built with ``accept_fds`` receives them into :attr:`Channel.fds`, in order, at most
:data:`MAX_HELD_FDS` waiting; any other channel reads with ``recv``, so the kernel discards
(and closes) whatever a peer tries to pass it.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from kvcr_policy.errors import ProtocolError

from .loop import Loop
from .requests import Timer
from .wire.framing import HEADER, MAX_PAYLOAD, FrameReader
from .wire.messages import KINDS, Err, Error, Message, decode, encode

__all__ = ["Budget", "Channel"]

log = logging.getLogger("kvcr_policy.backends.peer.channel")

#: Queued outbound bytes beyond which a peer that does not read is dropped.
MAX_OUTBOX = 64 << 20
_RECV_CHUNK = 1 << 20
#: Descriptors received and not yet taken beyond which the peer is dropped (one per attached
#: pool; a session attaches at most 64).
MAX_HELD_FDS = 64
_FD_SPACE = socket.CMSG_SPACE(MAX_HELD_FDS * array.array("i").itemsize)


class Budget(Protocol):
    """Bytes that payloads over ``free`` bytes may buffer, shared by a server's channels
    (:class:`~.server.budget.FrameBudget`)."""

    def take(self, holder: Any, tenant: str | None, nbytes: int) -> bool: ...

    def give(self, holder: Any, nbytes: int) -> None: ...


class Channel:
    """See the module docstring. ``on_message(message, request_id)``, ``on_closed(reason)``
    and ``on_malformed()`` run on the loop's thread; ``on_closed`` exactly once."""

    def __init__(
        self,
        loop: Loop,
        sock: socket.socket,
        *,
        name: str,
        on_message: Callable[[Message, int], None],
        on_closed: Callable[[str], None],
        max_payload: int = MAX_PAYLOAD,
        on_malformed: Callable[[], None] | None = None,
        frame_timeout_s: float | None = None,
        budget: Budget | None = None,
        free_payload: int = 0,
        tenant: Callable[[], str | None] = lambda: None,
        accept_fds: bool = False,
    ) -> None:
        self.loop = loop
        self.sock = sock
        self.name = name
        self.on_message = on_message
        self.on_closed = on_closed
        self.on_malformed = on_malformed  # a frame that did not decode (the server counts it)
        self.reader = FrameReader(KINDS, max_payload)
        self.last_recv = self.last_sent = self.last_frame = time.monotonic()
        self.waiting_since: float | None = None
        self.frames_in = 0  # whole frames received
        self.frame_timeout_s = frame_timeout_s
        self._budget = budget
        self._free = free_payload
        self._tenant = tenant  # whose budget the frames draw on (None before authentication)
        self._held = 0  # budget bytes this channel holds for the frame in progress
        self._frame_timer: Timer | None = None
        self.closed = False
        self.lingering = False
        self._out: deque[tuple[memoryview, tuple[int, ...]]] = deque()
        self.accept_fds = accept_fds
        self.fds: deque[int] = deque()  # received with frames, oldest first (accept_fds)
        self._out_bytes = 0
        self._linger_timer: Timer | None = None
        sock.setblocking(False)
        with contextlib.suppress(OSError):  # not a TCP socket (a socketpair in tests)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        loop.watch(sock, self._on_event, write=False)

    def send(self, message: Message, request: int = 0, fds: tuple[int, ...] = ()) -> None:
        """Queue ``message``; ``fds`` travel with its first bytes (a Unix socket only; they
        stay the caller's: the kernel passes duplicates)."""
        if self.closed or self.lingering:
            return
        frame = encode(message, request)
        if fds:  # duplicated now: the caller may close its own before the frame leaves
            fds = tuple(os.dup(fd) for fd in fds)
        self._out.append((memoryview(frame), fds))
        self._out_bytes += len(frame)
        if self._out_bytes > MAX_OUTBOX:
            self.close(f"peer does not read its replies ({self._out_bytes} bytes queued)")
            return
        self._flush()

    def _flush(self) -> None:
        while self._out:
            head, fds = self._out[0]
            try:
                if fds:
                    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
                    sent = self.sock.sendmsg([head], rights)
                    _close_all(fds)
                    fds = ()
                else:
                    sent = self.sock.send(head)
            except BlockingIOError:
                break
            except OSError as err:
                self.close(f"send failed: {err}")
                return
            self._out_bytes -= sent
            self.last_sent = time.monotonic()
            if self.waiting_since is None:
                self.waiting_since = self.last_sent
            if sent < len(head):
                self._out[0] = (head[sent:], ())
                break
            self._out.popleft()
        self.loop.watch(self.sock, self._on_event, write=bool(self._out))
        if self.lingering and not self._out:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_WR)

    def _on_event(self, mask: int) -> None:
        if self.closed:
            return
        if mask & 2:  # selectors.EVENT_WRITE
            self._flush()
        if not (mask & 1) or self.closed:
            return
        size, charged = self._next_read()
        try:
            data = self._receive(size)
        except BlockingIOError:
            self._uncharge(charged)
            return
        except OSError as err:
            self.close(f"receive failed: {err}")
            return
        self._uncharge(charged - len(data))
        if not data:
            self.close("peer closed the connection")
            return
        self.last_recv = time.monotonic()
        self.waiting_since = None
        if self.lingering:
            return  # draining until the peer closes its side
        try:
            for frame in self.reader.feed(data):
                self.last_frame = time.monotonic()
                self.frames_in += 1
                self._frame_done()
                message = decode(frame)
                self.on_message(message, frame.request)
                if self.closed or self.lingering:
                    return
        except ProtocolError as err:
            if self.on_malformed is not None:
                self.on_malformed()
            self.fail(Err.PROTOCOL, f"protocol error: {err}")
            return
        self._frame_started()

    def _receive(self, size: int) -> bytes:
        if not self.accept_fds:
            return self.sock.recv(size)
        data, ancillary, flags, _ = self.sock.recvmsg(size, _FD_SPACE, socket.MSG_CMSG_CLOEXEC)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
                self.fds.extend(fds)
        if flags & socket.MSG_CTRUNC or len(self.fds) > MAX_HELD_FDS:
            raise OSError(f"the peer passed more file descriptors than {MAX_HELD_FDS}")
        return data

    def take_fd(self) -> int | None:
        """The oldest descriptor received and not yet taken (now the caller's), or None."""
        return self.fds.popleft() if self.fds else None

    def _next_read(self) -> tuple[int, int]:
        """How many bytes to read now, and how many of them are charged to the budget."""
        reader = self.reader
        if self._budget is None:
            return _RECV_CHUNK, 0
        if reader.skipping:
            return min(_RECV_CHUNK, reader.skipping), 0
        if reader.expecting <= self._free:  # small frames, or the next header
            return HEADER.size + self._free, 0
        size = min(_RECV_CHUNK, reader.expecting - reader.buffered)
        if self._charge(size):
            return size, size
        return min(_RECV_CHUNK, reader.skipping), 0

    def _charge(self, nbytes: int) -> bool:
        """Charge ``nbytes`` of the large frame in progress; refuse the frame if refused."""
        assert self._budget is not None
        if self._budget.take(self, self._tenant(), nbytes):
            self._held += nbytes
            return True
        self._refuse_frame("the server's frame budget refused it")
        return False

    def _uncharge(self, nbytes: int) -> None:
        if nbytes > 0 and self._budget is not None:
            self._held -= nbytes
            self._budget.give(self, nbytes)

    def preempt(self) -> None:
        """Another tenant under its share needs the budget this channel's frame holds: drop
        the frame (its request is answered ERROR CAPACITY) and give the budget back."""
        if self.reader.expecting and not self.closed:
            self._refuse_frame("a tenant under its share of the frame budget needed it")

    def _refuse_frame(self, why: str) -> None:
        _kind, request, length = self.reader.discard()
        self._uncharge(self._held)
        text = (
            f"no buffer space for a frame of {length} bytes now ({why}: frames over "
            f"{self._free} bytes share the server's frame budget between tenants); try again"
        )
        log.warning("%s: %s", self.name, text)
        # Answered once the event at hand is over: a preempted channel is not the one reading.
        self.loop.call(self.send, Error(Err.CAPACITY, text), request)

    def _frame_started(self) -> None:
        """A frame is partly in: charge what of a large payload is already buffered (read
        among small frames) and start its deadline."""
        if not self.reader.partial:
            return
        reader = self.reader
        large = self._budget is not None and reader.expecting > self._free
        if large and reader.buffered > self._held:
            self._charge(reader.buffered - self._held)
        if self.frame_timeout_s is not None and self._frame_timer is None:
            limit = self.frame_timeout_s
            self._frame_timer = self.loop.later(limit, lambda: self._frame_overdue(limit))

    def _frame_done(self) -> None:
        if self._frame_timer is not None:
            self._frame_timer.cancel()
            self._frame_timer = None
        self._uncharge(self._held)

    def _frame_overdue(self, limit: float) -> None:
        self._frame_timer = None
        if not self.closed and self.reader.partial:
            got = self.reader.buffered
            self.fail(
                Err.TIMEOUT, f"a frame did not arrive whole within {limit} s ({got} bytes in)"
            )

    def pump(self) -> None:
        """Read what already arrived now (before judging the peer silent: this loop may have
        been the one that stalled, in a long progress call, with the peer's bytes waiting)."""
        if not self.closed:
            self._on_event(1)

    def fail(self, code: int, text: str, request: int = 0) -> None:
        """Tell the peer why (best effort; as the answer to ``request`` if one is named), log
        it, and close."""
        log.warning("%s: %s; closing the connection", self.name, text)
        self.send(Error(code, text), request)
        self.close(text)

    def linger(self, timeout: float, reason: str) -> None:
        """Stop handling frames, flush, half-close, and close once the peer closes its side (or
        after ``timeout``): the peer then no longer touches memory we are about to reuse."""
        if self.closed or self.lingering:
            return
        self.lingering = True
        self._flush()
        self._linger_timer = self.loop.later(timeout, lambda: self.close(reason))

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        self.loop.unwatch(self.sock)
        with contextlib.suppress(OSError):
            self.sock.close()
        for _, fds in self._out:
            _close_all(fds)
        self._out.clear()
        _close_all(self.fds)
        self.fds.clear()
        self._frame_done()
        self.on_closed(reason)


def _close_all(fds: Any) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
