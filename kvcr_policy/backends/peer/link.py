"""Link: the UCX worker of one connection (client side) or one session (server side).

Every connection gets a UCX worker of its own, created when it starts and retired when it
ends, rather than one worker per process shared by all, for two reasons:

- **A dead peer cannot poison the next connection.** Over shared memory a message is written
  into the *receiver's* FIFO: the sender takes a slot by advancing the FIFO's head, copies the
  message in, then flips the slot's owner bit; the receiver reads slots strictly in order
  (UCX ``src/uct/sm/mm/base/mm_ep.c``, ``uct_mm_ep_am_common_send``). A sender killed between
  the two steps leaves a slot that never becomes ready, and every later message to that worker,
  from any peer, waits behind it for good. A shared worker then never received again: after a
  server was killed mid-send and restarted, its client reconnected but no transfer completed
  (seen in about one kill in five). A worker per connection confines that to the connection
  that died, whose worker is thrown away with it.
- **Tags are matched per worker.** A receive posted on a worker matches a message from any
  endpoint of that worker; with one worker per session only that session's client can reach
  the receives posted for it.

Retiring a link closes nothing by itself: its owner closes the endpoint (which cancels what is
posted on it), then :meth:`Link.retire` keeps the worker progressed for a grace period so those
requests complete. A link with nothing left is destroyed. Requests still pending at the end of
the grace are abandoned (their groups finish, every message failed) and the link is *frozen*:
never progressed again, its requests and buffers kept referenced. Over ``tcp`` and shared
memory without CMA the receiving worker copies every byte during its own progress, so a frozen
link can no longer write into the memory of an abandoned receive: that memory may be reused at
once. (With ``cma`` the peer writes directly and freezing does not stop it; see that option.)

All methods run on the loop thread (:class:`~.worker.Worker`), the one thread calling UCX.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from .requests import RequestGroup, Timer

__all__ = ["Link", "LinkHost"]

log = logging.getLogger("kvcr_policy.backends.peer.link")

_TAG_SPACE = 1 << 64


class LinkHost(Protocol):
    """What a link needs from the loop that progresses it (see :class:`~.worker.Worker`)."""

    progress_mode: str

    def later(self, delay: float, fn: Callable[[], None]) -> Timer: ...

    def drop_link(self, link: Link) -> None: ...


class Link:
    """See the module docstring; made by :meth:`~.worker.Worker.open_link`."""

    def __init__(self, host: LinkHost, ucx: Any, array: Any, context: Any, name: str) -> None:
        self.host = host
        self.name = name
        self.ucx = ucx
        self._array = array
        threaded = host.progress_mode == "thread"
        self.ucx_worker = ucx.UCXWorker(context, enable_delayed_submission=threaded)
        if threaded:
            self.ucx_worker.start_progress_thread(polling_mode=False, epoll_timeout=1)
        else:
            self.ucx_worker.init_blocking_progress_mode()
        self.epoll_fd: int | None = (
            self.ucx_worker.epoll_file_descriptor if host.progress_mode == "blocking" else None
        )
        self.address: bytes = self.ucx_worker.address.tobytes()
        self.state = "open"  # open -> retiring -> (destroyed | frozen)
        self.groups: list[RequestGroup] = []
        self.completions = 0  # messages completed on this link (grows while bytes move)
        self._graveyard: list[tuple[list[Any], list[Any]]] = []
        self._endpoints: list[Any] = []
        self._retire_timer: Timer | None = None
        self.opened = time.monotonic()

    # ---- endpoints and requests -----------------------------------------------------------

    def connect(self, address: bytes, error_handling: bool) -> Any:
        """An endpoint to the UCX worker whose packed address is ``address``."""
        ucx = self.ucx
        remote = ucx.UCXAddress.create_from_buffer(address)
        ep = ucx.UCXEndpoint.create_from_worker_address(self.ucx_worker, remote, error_handling)
        self._endpoints.append(ep)
        return ep

    @staticmethod
    def close_endpoint(ep: Any, error_handling: bool) -> None:
        """Close ``ep`` and cancel the receives posted on it (they complete as cancelled).

        Measured with ucxx 0.52 / UCX 1.21: with error handling, ``close()`` of an endpoint
        whose peer failed crashes the process and ``close()`` of a live one leaves receives
        pending, while ``close_blocking()`` does neither; without error handling,
        ``close_blocking()`` hangs when the peer died mid-rendezvous, while ``close()``
        returns at once and the next progress cancels the receives.
        """
        try:
            if error_handling:
                ep.close_blocking()
            else:
                ep.close()
        except Exception as err:  # the endpoint is gone either way
            log.debug("closing an endpoint: %s", err)

    def tags(self, count: int) -> int:
        """The first of ``count`` consecutive tags, drawn at random.

        Only this link's peer can send to its worker, and a random 64-bit base keeps even that
        peer from aiming at a receive it was not told of; two transfers in flight overlap with a
        chance of about n / 2^64.
        """
        return secrets.randbelow(_TAG_SPACE - max(1, count))

    def post(self, group: RequestGroup, ep: Any, send: bool, view: np.ndarray, tag: int) -> None:
        """Post one tag send or receive of ``view`` (kept alive by the group)."""
        array = self._array(view)
        tag_obj = self.ucx.UCXXTag(tag)
        request = ep.tag_send(array, tag_obj) if send else ep.tag_recv(array, tag_obj)
        group.requests.append(request)
        group.keep.append(array)

    def track(self, group: RequestGroup) -> None:
        """Finish ``group`` once its requests completed (checked on every progress)."""
        self.groups.append(group)

    def abandon(self, group: RequestGroup) -> None:
        """Finish a group now, every message failed, keeping its requests and buffers.

        Requests to or from a peer that died while connected without error handling (shared
        memory) never complete, not even after the endpoint is closed (UCX cannot cancel a
        receive it has matched). Sends only read their buffers, so their owner may settle at
        once; receives are abandoned once their sender is known to be gone, or when the link
        freezes (see the module docstring). The requests stay referenced with their buffers.
        """
        if group.done:
            return
        self._graveyard.append((group.requests, group.keep))
        group.failed = np.ones(len(group.requests), dtype=bool)
        group.requests, group.keep = [], []
        group.finish()

    # ---- lifetime -------------------------------------------------------------------------

    def retire(self, grace_s: float) -> None:
        """No new requests; progress for up to ``grace_s`` so cancelled requests complete, then
        destroy the link, or abandon what is left and freeze it (see the module docstring)."""
        if self.state != "open":
            return
        self.state = "retiring"
        self._retire_timer = self.host.later(max(0.0, grace_s), self._grace_over)
        self._settle()

    def _grace_over(self) -> None:
        if self.state != "retiring":
            return
        pending = [group for group in self.groups if not group.done]
        for group in pending:
            self.abandon(group)
        self.groups = []
        self._reap()
        if self._graveyard:
            self._freeze()
        else:
            self._destroy()

    def _settle(self) -> None:
        """A retiring link whose requests all completed is destroyed at once."""
        if self.state != "retiring":
            return
        if any(not group.done for group in self.groups):
            return
        self._reap()
        if not self._graveyard:
            if self._retire_timer is not None:
                self._retire_timer.cancel()
            self._destroy()

    def _reap(self) -> None:
        self._graveyard = [
            (requests, keep)
            for requests, keep in self._graveyard
            if not all(request.completed for request in requests)
        ]

    def _freeze(self) -> None:
        count = sum(len(requests) for requests, _ in self._graveyard)
        log.info(
            "%s: %d UCX requests never completed (the peer died mid-transfer); the link is "
            "frozen: never progressed again, so nothing can land in their buffers",
            self.name,
            count,
        )
        self.state = "frozen"
        self.host.drop_link(self)
        _FROZEN.append(self)

    def _destroy(self) -> None:
        self.state = "destroyed"
        self.host.drop_link(self)
        self.stop()

    def stop(self) -> None:
        """Stop ucxx's progress thread (``thread`` mode) and drop every UCX object."""
        if self.host.progress_mode == "thread" and self.ucx_worker is not None:
            try:
                self.ucx_worker.stop_progress_thread()
            except Exception as err:
                log.debug("%s: stopping the progress thread: %s", self.name, err)
        self._endpoints.clear()
        self.groups = []
        self._graveyard = []
        self.ucx_worker = None

    # ---- progress (the loop, every turn) --------------------------------------------------

    def progress(self) -> None:
        """Progress the UCX worker (unless ucxx's thread does) and finish completed groups."""
        if self.host.progress_mode != "thread":
            self.ucx_worker.progress()
        if self.groups:
            self._poll_groups()
        if self._graveyard and self.state == "retiring":
            self._settle()

    def arm(self) -> bool:
        """Whether the worker may sleep now (``ucp_worker_arm``: no event pending)."""
        return bool(self.ucx_worker.arm())

    def _poll_groups(self) -> None:
        still: list[RequestGroup] = []
        finished: list[RequestGroup] = []
        moved = 0
        for group in self.groups:
            before = group.progress
            (finished if group.poll() else still).append(group)
            moved += group.progress - before
        self.completions += moved
        self.groups = still
        for group in finished:
            try:
                group.finish()
            except Exception:
                log.exception("completion handler failed")
        if finished and self.state == "retiring":
            self._settle()


#: Links frozen with requests that never completed: kept referenced (their buffers too) for the
#: life of the process; counted in :meth:`~.worker.Worker.describe`.
_FROZEN: list[Link] = []


def frozen_links() -> int:
    """How many links this process froze (see the module docstring)."""
    return len(_FROZEN)
