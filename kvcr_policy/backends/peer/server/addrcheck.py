"""Validate a client's UCX worker address in a helper process before the server unpacks it.

UCX trusts worker addresses: a malformed one trips an assertion and aborts the process that
unpacks it (measured with ucxx 0.52 / UCX 1.21: ``address.c: Assertion ... addr version``). A
peer server must not die of a hostile frame, so it first hands each new address to a helper
process (``python -m kvcr_policy.backends.peer.server.addrcheck``) that creates and closes an
endpoint to it with the same UCX configuration; if the helper survives, the server may unpack
the same bytes. Addresses already checked are remembered (good and bad).

Only authenticated clients get here (see :mod:`.handshake`), and no client can stall the
others: checks are taken from each tenant's queue in turn, a tenant may have at most
:data:`MAX_PENDING_PER_TENANT` waiting (more are refused at once), and a check whose
connection has closed meanwhile is skipped. A helper that dies is replaced by a spare started
ahead of time (starting one takes about 0.7 s, importing ucxx), and the tenant whose address
killed it waits out a pause that doubles with each crash (:data:`FIRST_PAUSE_S` up to
:data:`MAX_PAUSE_S`), so that the others' checks run first on a warm helper.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future

from kvcr_policy.errors import CapacityError

__all__ = ["MAX_PENDING_PER_TENANT", "READY_TIMEOUT_S", "AddressChecker", "main"]

log = logging.getLogger("kvcr_policy.backends.peer.server.addrcheck")

_REQUEST = struct.Struct("<BI")
_CHECK_TIMEOUT_S = 10.0
#: How long a new helper may take to say it is ready (importing ucxx: about 0.7 s on a quiet
#: host, many seconds on a busy one); the check's own limit starts only after that.
READY_TIMEOUT_S = 120.0
_READY = b"R"
MAX_PENDING_PER_TENANT = 4
FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 30.0
_REMEMBERED = 4096  # addresses whose verdict is kept (each a 32-byte digest)

_Job = tuple[bytes, bool, Callable[[], bool], "Future[bool]"]


class AddressChecker:
    """Checks addresses one at a time on a thread of its own, tenants in turn; results
    arrive as futures."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._spare: subprocess.Popen[bytes] | None = None
        self._ready: set[int] = set()  # helpers (by pid) that said they are ready
        self._paused: dict[str, tuple[float, float]] = {}  # tenant -> (until, last pause)
        self._verdicts: OrderedDict[bytes, bool] = OrderedDict()
        self._queues: OrderedDict[str, deque[_Job]] = OrderedDict()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvcr-addrcheck", daemon=True)
        self._thread.start()

    def check(
        self,
        address: bytes,
        error_handling: bool,
        tenant: str = "",
        wanted: Callable[[], bool] = lambda: True,
    ) -> Future[bool]:
        """A future of whether ``address`` is safe to unpack; ``wanted()`` False skips it."""
        future: Future[bool] = Future()
        with self._cond:
            queue = self._queues.setdefault(tenant, deque())
            if len(queue) >= MAX_PENDING_PER_TENANT:
                message = (
                    f"tenant {tenant!r} already has {len(queue)} connections waiting for their "
                    "UCX address check; try again"
                )
                future.set_exception(CapacityError(message))
                return future
            queue.append((address, error_handling, wanted, future))
            self._cond.notify()
        return future

    def _next(self) -> tuple[str, _Job] | None:
        """The next job and its tenant, round robin over tenants not paused (None once
        closed)."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                wake = None
                for tenant in list(self._queues):
                    until = self._paused.get(tenant, (0.0, 0.0))[0]
                    if until > now:
                        wake = until if wake is None else min(wake, until)
                        continue
                    queue = self._queues.pop(tenant)
                    if queue:
                        job = queue.popleft()
                        self._queues[tenant] = queue  # to the back of the turn
                        return tenant, job
                self._cond.wait(None if wake is None else wake - now)
            return None

    def _run(self) -> None:
        self._ensure()  # start the helpers early: importing ucxx takes a while
        while (picked := self._next()) is not None:
            tenant, (address, error_handling, wanted, future) = picked
            if not future.set_running_or_notify_cancel():
                continue
            try:
                ok = wanted() and self._check(address, error_handling, tenant)
                future.set_result(ok)
            except Exception as err:  # the checker thread must survive anything
                future.set_exception(err)

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "kvcr_policy.backends.peer.server.addrcheck"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=dict(os.environ),
        )

    def _ensure(self) -> subprocess.Popen[bytes] | None:
        """The helper to use, a live spare beside it (both started here when missing)."""
        with self._cond:
            if self._closed:
                return None
            if self._proc is None or self._proc.poll() is not None:
                spare, self._spare = self._spare, None
                self._proc = spare if spare is not None and spare.poll() is None else self._spawn()
            if self._spare is None or self._spare.poll() is not None:
                self._spare = self._spawn()
            return self._proc

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether ``proc`` said it is ready (read once per helper, within READY_TIMEOUT_S)."""
        if proc.pid in self._ready:
            return True
        assert proc.stdout is not None
        timer = threading.Timer(READY_TIMEOUT_S, proc.kill)
        timer.start()
        try:
            said = proc.stdout.read(1)
        except OSError:
            said = b""
        finally:
            timer.cancel()
        if said != _READY:
            log.warning("the address checker's helper did not start (%r)", said)
            return False
        self._ready.add(proc.pid)
        return True

    def _crashed(self, proc: subprocess.Popen[bytes], tenant: str) -> None:
        """``tenant``'s address killed the helper: replace it now and pause that tenant."""
        log.warning(
            "an address of tenant %r crashed the checker; refusing it and pausing that "
            "tenant's checks",
            tenant,
        )
        proc.kill()
        proc.wait()
        last = self._paused.get(tenant, (0.0, 0.0))[1]
        pause = min(MAX_PAUSE_S, 2 * last) if last else FIRST_PAUSE_S
        with self._cond:
            self._paused[tenant] = (time.monotonic() + pause, pause)
        self._ensure()

    def _check(self, address: bytes, error_handling: bool, tenant: str) -> bool:
        key = hashlib.sha256(bytes([error_handling]) + address).digest()
        known = self._verdicts.get(key)
        if known is not None:
            return known
        proc = self._ensure()
        if proc is None or proc.stdin is None or proc.stdout is None:
            return False
        if not self._wait_ready(proc):  # not the tenant's doing: replace it, pause nobody
            proc.kill()
            proc.wait()
            self._ensure()
            return False
        timer = threading.Timer(_CHECK_TIMEOUT_S, proc.kill)
        timer.start()
        try:
            proc.stdin.write(_REQUEST.pack(error_handling, len(address)) + address)
            proc.stdin.flush()
            answer = proc.stdout.read(1)
        except OSError:
            answer = b""
        finally:
            timer.cancel()
        if answer not in (b"\x00", b"\x01"):  # it died (or said something else): replace it
            self._crashed(proc, tenant)
        elif tenant in self._paused and self._paused[tenant][0] <= time.monotonic():
            with self._cond:
                self._paused.pop(tenant, None)  # a check that did not crash: no more pause
        good = answer == b"\x01"
        self._verdicts[key] = good
        while len(self._verdicts) > _REMEMBERED:
            self._verdicts.popitem(last=False)
        return good

    def close(self) -> None:
        with self._cond:
            self._closed = True
            proc, self._proc = self._proc, None
            spare, self._spare = self._spare, None
            jobs = [job for queue in self._queues.values() for job in queue]
            self._queues.clear()
            self._cond.notify_all()
        for *_, future in jobs:
            future.cancel()
        for helper in (proc, spare):
            if helper is not None:
                helper.kill()
                helper.wait()


def main() -> None:
    """The helper: read (error_handling, address) requests on stdin, answer 1 or 0."""
    # UCX logs (its assertion included) go to file descriptor 1: keep the answers on a
    # descriptor of their own and send fd 1 where stderr goes.
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    import ucxx._lib.libucxx as ucx_api

    context = ucx_api.UCXContext(feature_flags=(ucx_api.Feature.TAG,))
    worker = ucx_api.UCXWorker(context)
    answers.write(_READY)
    stdin = sys.stdin.buffer
    while True:
        head = stdin.read(_REQUEST.size)
        if len(head) < _REQUEST.size:
            return
        error_handling, length = _REQUEST.unpack(head)
        raw = stdin.read(length)
        ok = False
        try:
            address = ucx_api.UCXAddress.create_from_buffer(raw)
            ep = ucx_api.UCXEndpoint.create_from_worker_address(
                worker, address, bool(error_handling)
            )
            worker.progress()
            # As Worker.close_endpoint: close() of a failed endpoint with error handling
            # crashes, close_blocking() without it can hang.
            ep.close_blocking() if error_handling else ep.close()
            worker.progress()
            ok = True
        except Exception:  # refused by UCX (not crashed): not usable either
            ok = False
        answers.write(b"\x01" if ok else b"\x00")


if __name__ == "__main__":
    main()
