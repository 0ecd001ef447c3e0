"""Quarantine: reserved slots a shared-memory client may still be writing after its session.

A same-host client writes a reservation's pages straight into the tier's shared memory, with
its own copy threads, and says COMMIT afterwards (:mod:`.transfers`). When its session ends
first (it died, or stalled past a deadline and the server cut it), nothing on the server can
stop a copy that is still running in the client: handing those slots to the next writer could
let the late copy overwrite a page that writer published. So they are neither published nor
freed: they stay reserved until the client *process* has exited, which the server learns from
a pidfd (``pidfd_open(2)``, opened when the client connected, so a reused pid never counts)
becoming readable on its loop. Without a pidfd (a kernel before 5.3, or a client in another
PID namespace) they stay reserved for the server's life: a bounded leak, at most the batches
that client had in flight, logged and counted, never a wrong byte.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["Held", "Quarantine", "open_pidfd"]

log = logging.getLogger("kvcr_policy.backends.peer.server")


class _Loop(Protocol):
    def watch(self, sock: Any, callback: Callable[[int], None], write: bool) -> None: ...

    def unwatch(self, sock: Any) -> None: ...


@dataclass(frozen=True, slots=True)
class Held:
    """One reservation kept from reuse: how to let it go, and how many slots it holds."""

    abort: Callable[[], None]
    slots: int


class _Fd:
    """A pidfd as the loop's selector wants it (an object with ``fileno``)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd


def open_pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (None: no pid, no pidfd_open, or the process is gone already)."""
    if pid <= 0 or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


class Quarantine:
    """Reservations held per client process (loop thread only); see the module docstring."""

    def __init__(self, loop: _Loop) -> None:
        self._loop = loop
        self._held: dict[int, tuple[_Fd, list[Held]]] = {}  # by pidfd
        self._forever: list[Held] = []
        self.released = 0  # slots given back once their writer had exited

    @property
    def slots(self) -> int:
        """Slots held now."""
        held = sum(h.slots for _, items in self._held.values() for h in items)
        return held + sum(h.slots for h in self._forever)

    def hold(self, pidfd: int | None, items: Sequence[Held], who: str) -> None:
        """Keep ``items`` until the process of ``pidfd`` exits (the pidfd is now ours)."""
        slots = sum(h.slots for h in items)
        if pidfd is None:
            self._forever.extend(items)
            log.warning(
                "client %s: its session ended with %d reserved slots it may still be writing; "
                "no pidfd tells when it exits, so they stay reserved for this server's life",
                who,
                slots,
            )
            return
        if _exited(pidfd):
            os.close(pidfd)
            self._abort(items)
            return
        entry = self._held.get(pidfd)
        if entry is None:
            fd = _Fd(pidfd)
            self._held[pidfd] = (fd, list(items))
            self._loop.watch(fd, lambda mask: self._exited(pidfd), False)
        else:
            entry[1].extend(items)
        log.info(
            "client %s: its session ended with %d reserved slots it may still be writing; they "
            "stay reserved until the client process exits",
            who,
            slots,
        )

    def _exited(self, pidfd: int) -> None:
        entry = self._held.pop(pidfd, None)
        if entry is None:
            return
        fd, items = entry
        self._loop.unwatch(fd)
        os.close(pidfd)
        self._abort(items)

    def _abort(self, items: Sequence[Held]) -> None:
        for item in items:
            with contextlib.suppress(Exception):  # the store may be closed (server stopping)
                item.abort()
            self.released += item.slots

    def close(self) -> None:
        """Stop watching (the server is stopping; its tiers close after this)."""
        for pidfd, (fd, _) in list(self._held.items()):
            self._loop.unwatch(fd)
            os.close(pidfd)
        self._held.clear()
        self._forever.clear()


def _exited(pidfd: int) -> bool:
    """Whether the process of ``pidfd`` has exited (a pidfd polls readable then)."""
    ready, _, _ = select.select([pidfd], [], [], 0)
    return bool(ready)
