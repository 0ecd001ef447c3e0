"""Health: the master's state as a circuit breaker in front of every store call.

While the master is down, each Mooncake call blocks about 4.4 s before it fails (RPC_FAIL),
and ``health_check()`` keeps answering 0 for about 13 s after a kill -9 (both measured with
mooncake-transfer-engine-non-cuda 0.3.13.post1). SGLang's prefetch and backup threads must not
wait that long per call, so the breaker opens on the first sign and calls answer misses at
once until the master is back:

- **closed**: calls go through. A call that returns RPC_FAIL or RPC_TIMEOUT, a
  ``health_check()`` that is not 0, or the watcher opens it.
- **open**: :meth:`Health.allows` is False at once (no RPC); the callers turn that into misses.

A watcher thread checks every ``interval`` seconds: a TCP connect to the master's RPC port
while closed (a master killed between calls is noticed before the next call would block), and
while open the connect, ``health_check()`` and one real query (``probe``); when all three
succeed the breaker closes. The client reconnects to a restarted master by itself (about
0.9 s), so service resumes within about ``interval`` of that, without a restart. A restarted
master has forgotten every key: the cache is empty, not wrong.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["Health"]

log = logging.getLogger("kvcr_policy_mooncake.health")


class Health:
    """See the module docstring. ``check`` is the client's ``health_check`` (0: healthy),
    ``probe`` one real query of the master that returns whether it answered."""

    def __init__(
        self,
        address: tuple[str, int],
        check: Callable[[], int],
        probe: Callable[[], bool],
        interval: float,
    ) -> None:
        self.address = address
        self._check = check
        self._probe = probe
        self.interval = interval
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self.is_open = False
        self.reason = ""
        self.opened_at = 0.0
        self.trips = 0
        self.refused = 0  # calls answered at once while open
        self.last_outage_s: float | None = None
        self._watcher = threading.Thread(
            target=self._watch, name="kvcr-mooncake-health", daemon=True
        )
        self._watcher.start()

    @property
    def where(self) -> str:
        host, port = self.address
        return f"{host}:{port}"

    def allows(self) -> bool:
        """Whether a store call may go out now; False counts as a call refused (a miss)."""
        if self.is_open:
            self.refused += 1
            return False
        code = self._check()
        if code != 0:
            self.trip(f"health_check() = {code}")
            self.refused += 1
            return False
        return True

    def trip(self, reason: str) -> None:
        """Open the breaker (once per outage) and let the watcher look for the master."""
        with self._lock:
            if self.is_open or self._stopped:
                return
            self.is_open = True
            self.reason = reason
            self.opened_at = time.monotonic()
            self.trips += 1
        log.warning(
            "Mooncake master %s unreachable (%s): store calls answer misses until it is back",
            self.where,
            reason,
        )
        self._wake.set()

    def _reachable(self) -> bool:
        try:
            with socket.create_connection(self.address, timeout=min(self.interval, 2.0)):
                return True
        except OSError:
            return False

    def _recovered(self) -> bool:
        try:
            return self._reachable() and self._check() == 0 and self._probe()
        except Exception as err:  # a probe that raises is one that failed
            log.debug("Mooncake health probe failed: %s", err)
            return False

    def _watch(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stopped:
                return
            if not self.is_open:
                if not self._reachable():
                    self.trip("its RPC port refused a connection")
                continue
            if self._recovered():
                with self._lock:
                    outage = time.monotonic() - self.opened_at
                    self.is_open = False
                    self.last_outage_s = outage
                log.warning(
                    "Mooncake master %s answers again after %.1f s; store calls resume (a "
                    "restarted master starts empty)",
                    self.where,
                    outage,
                )

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
        self._wake.set()
        self._watcher.join(5.0)

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": "open" if self.is_open else "closed",
            "reason": self.reason if self.is_open else None,
            "trips": self.trips,
            "refused_calls": self.refused,
            "last_outage_s": self.last_outage_s,
        }
