"""Memory pre-flight: a tier is held to what this process can get before it is mapped.

A tier larger than its process's memory cgroup is not refused by the kernel: ``mmap`` succeeds
(overcommit), and the process is SIGKILLed by the OOM killer (exit 137, no message) once
pre-fault, a DMA registration or the pages stored fill it past the limit. So every place that
is about to map a tier asks :func:`check_tier` first, and a tier that cannot be had is refused
with one :class:`~kvcr_policy.errors.TierMemoryError` naming ``placement.capacity_bytes``, its
origin, what is available, the limit that binds (with the file it was read from) and the fix.

Which memory a tier is held to (:class:`~.headroom.Headroom`):

- pre-faulted or pinned (``committed``): it takes all of its memory at once, so it must fit in
  what the process may take *now*;
- otherwise it takes memory as pages arrive, up to all of it (a tier is made to run full), so it
  must fit under this process's own limits as they stand (its memory cgroup, its address
  space) and the host's whole memory; where it is more than the host has free this second, one
  warning says so (other processes may free it by then, or not).

``pending`` counts the tiers this process opened before, which fill as pages arrive and are not
yet in any usage the kernel reports. :func:`check_host` is the question ``validate`` and
``sglang-config --check`` ask: could one tier of this configuration fit this host at all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kvcr_policy.config.schema import PlacementSection
from kvcr_policy.errors import TierMemoryError
from kvcr_policy.values import as_written, sized

from . import linux as _os
from .headroom import Binding, Headroom, read_headroom

__all__ = ["SETTING", "TierRequest", "check_host", "check_placement", "check_tier", "mapped_bytes"]

log = logging.getLogger("kvcr_policy.memory.preflight")
SETTING = "placement.capacity_bytes"


@dataclass(frozen=True, slots=True)
class TierRequest:
    """A tier about to be mapped: what it is, how many bytes, and how they are taken."""

    what: str  # "the tier of pool 'kv'": the subject of the message
    nbytes: int  # bytes it maps (see mapped_bytes)
    committed: bool  # pre-faulted or pinned: all of it at once
    pending: int = 0  # earlier tiers of this process that fill as pages arrive


def mapped_bytes(size: int) -> int:
    """The bytes a region of ``size`` maps: whole huge pages (memory.region rounds so)."""
    huge = _os.huge_page_size()
    return -(-size // huge) * huge


def check_tier(
    request: TierRequest,
    capacity: int,
    origin: str,
    headroom: Headroom | None = None,
    *,
    setting: str = SETTING,
    written: str | None = None,
) -> Binding | None:
    """Refuse ``request`` (:class:`TierMemoryError`) unless it fits what this process can get;
        ``capacity`` and ``origin``: ``placement.capacity_bytes`` (or the ``setting`` that sized
        it) and where it came from; ``written``: the size as the user wrote it (``64GB``), echoed
    with its binary size beside it. Returns the binding limit (None where nothing was read)."""
    headroom = read_headroom() if headroom is None else headroom
    binding = headroom.now() if request.committed else headroom.grow()
    need = request.nbytes + request.pending
    if binding is not None and need > binding.available:
        raise TierMemoryError(_message(request, capacity, origin, binding, False, setting, written))
    now = headroom.now()
    if not request.committed and now is not None and need > now.available:
        log.warning(
            "%s (%s = %s, from %s) grows to %s as pages arrive; %s: it fills only as far as "
            "memory is freed by then",
            request.what, setting, sized(capacity), origin, sized(need), _left(now),
        )  # fmt: skip
    return binding


def check_host(
    capacity: int,
    origin: str,
    *,
    what: str = "each pool's tier",
    headroom: Headroom | None = None,
    written: str | None = None,
) -> Binding | None:
    """Refuse a tier of ``capacity`` bytes that is more than this host (or its memory cgroup)
    holds at all, whatever else runs: the question of ``validate``."""
    headroom = read_headroom() if headroom is None else headroom
    binding = headroom.host()
    request = TierRequest(what, mapped_bytes(capacity), committed=False)
    if binding is not None and request.nbytes > binding.available:
        raise TierMemoryError(_message(request, capacity, origin, binding, True, SETTING, written))
    return binding


def check_placement(
    placement: PlacementSection,
    origin: str,
    *,
    what: str,
    host: bool = False,
    written: str | None = None,
) -> Binding | None:
    """:func:`check_tier` (or with ``host``, :func:`check_host`) of one tier of ``placement``."""
    capacity = int(placement.capacity_bytes)
    if host:
        return check_host(capacity, origin, what=what, written=written)
    request = TierRequest(what, mapped_bytes(capacity), committed=placement.prefault)
    return check_tier(request, capacity, origin, written=written)


def _left(binding: Binding) -> str:
    limit = binding.limit
    return (
        f"{limit.name} leaves {sized(binding.available)} of {sized(limit.total)} "
        f"({limit.source}; {sized(limit.in_use)} in use)"
    )


def _message(
    request: TierRequest,
    capacity: int,
    origin: str,
    binding: Binding,
    whole: bool,
    setting: str,
    written: str | None = None,
) -> str:
    limit = binding.limit
    if whole or (limit.shared and not request.committed):
        room = f"{limit.total_name} is {sized(limit.total)} ({limit.source})"
    else:
        room = _left(binding)
    size = sized(request.nbytes)
    taken = f"takes {size} at once (pre-faulted, or pinned for DMA)"
    if not request.committed:
        taken = f"grows to {size} as pages arrive"
    before = ""
    if request.pending:
        before = f" besides the {sized(request.pending)} that the tiers opened before it grow to"
    huge = _os.huge_page_size()
    most = (binding.available - request.pending) // huge * huge
    lower = f"lower {setting} to at most {sized(most)}" if most > 0 else f"lower {setting}"
    where = "this host holds" if whole else "this process can get"
    return (
        f"{setting} = {as_written(written, capacity)} (from {origin}) is more than the memory "
        f"{where}: "
        f"{request.what} {taken}{before}, and {room}; {lower}, or "
        f"{limit.fix}"
    )
