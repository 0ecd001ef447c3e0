"""Validate a client's UCX worker address in a helper process before the server unpacks it.

UCX trusts worker addresses: a malformed one trips an assertion and aborts the process that
unpacks it (measured with ucxx 0.52 / UCX 1.21: ``address.c: Assertion ... addr version``). A
peer server must not die of a hostile frame, so it first hands each new address to a helper
process (``python -m kvcr_policy.backends.peer.server.addrcheck``) that creates and closes an
endpoint to it with the same UCX configuration; if the helper survives, the server may unpack
the same bytes.
Addresses already checked are remembered; a helper that died is replaced on the next check.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor

__all__ = ["AddressChecker", "main"]

log = logging.getLogger("kvcr_policy.backends.peer.server.addrcheck")

_REQUEST = struct.Struct("<BI")
_CHECK_TIMEOUT_S = 10.0


class AddressChecker:
    """Checks addresses one at a time on a worker thread; results arrive as futures."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvcr-addrcheck")
        self._proc: subprocess.Popen[bytes] | None = None
        self._good: set[bytes] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._pool.submit(self._ensure)  # start the helper early: importing ucxx takes a while

    def check(self, address: bytes, error_handling: bool) -> Future[bool]:
        return self._pool.submit(self._check, address, error_handling)

    def _ensure(self) -> subprocess.Popen[bytes] | None:
        with self._lock:
            if self._closed:
                return None
            if self._proc is None or self._proc.poll() is not None:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "kvcr_policy.backends.peer.server.addrcheck"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env=dict(os.environ),
                )
            return self._proc

    def _check(self, address: bytes, error_handling: bool) -> bool:
        key = hashlib.sha256(bytes([error_handling]) + address).digest()
        if key in self._good:
            return True
        proc = self._ensure()
        if proc is None or proc.stdin is None or proc.stdout is None:
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
        if answer == b"\x01":
            self._good.add(key)
            return True
        if answer != b"\x00":  # it died (or said something else): replace it next time
            log.warning("a client's UCX worker address crashed the checker; refusing it")
            proc.kill()
            proc.wait()
        return False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
        self._pool.shutdown(wait=False, cancel_futures=True)


def main() -> None:
    """The helper: read (error_handling, address) requests on stdin, answer 1 or 0."""
    # UCX logs (its assertion included) go to file descriptor 1: keep the answers on a
    # descriptor of their own and send fd 1 where stderr goes.
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    import ucxx._lib.libucxx as ucx_api

    context = ucx_api.UCXContext(feature_flags=(ucx_api.Feature.TAG,))
    worker = ucx_api.UCXWorker(context)
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
