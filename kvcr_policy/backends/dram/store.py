"""Key -> slot index for one pool's DRAM tier: extents, eviction, reservations, claims.

The pipeline builds one :class:`Store` per pool. The tier of that pool has ``capacity`` slots of
one page each; the store only decides which slot a key lives in, the pipeline moves the bytes.

Every slot is in one :class:`SlotState`; the transitions are::

    FREE       reserve                           -> RESERVED
    RESERVED   commit with ok, publish           -> PUBLISHED
    RESERVED   commit without ok, abort          -> FREE
    RESERVED   delete, clear                     -> CANCELLED
    CANCELLED  commit, abort                     -> FREE
    PUBLISHED  delete, clear, evict (unclaimed)  -> FREE
    PUBLISHED  delete, clear (while claimed)     -> ORPHANED
    ORPHANED   last release                      -> FREE

- A write reserves slots (invisible to lookups), copies into them, then commits exactly the keys
  whose copy succeeded. A write of new keys in many batches may publish each batch's keys as
  soon as its copy succeeded (:meth:`Store.publish`), so its commit has only the rest left.
- A read claims the slots of the leading present run for the whole transfer and releases them
  after. A claimed slot is never evicted, overwritten or freed.
- Each new occupant of a slot bumps the slot's generation; reservations and claims carry the
  generation they saw, so a late commit, abort or release can never act on a newer occupant.

All methods take one lock: SGLang calls from its prefetch and backup threads at once. Lookups
(:meth:`Store.contains_prefix`, :meth:`Store.lookup`) cost one dict probe per key, run in C
iterators and allocate nothing per key.
"""

from __future__ import annotations

import collections
import enum
import functools
import itertools
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar, cast

import numpy as np

from kvcr_policy.backends.dram.claims import ClaimCounts
from kvcr_policy.backends.dram.extents import _FreeExtents, count_extents
from kvcr_policy.backends.dram.recent import RecentKeys
from kvcr_policy.builtin.eviction import EVICTION_POLICIES, FIFOPolicy, LRUPolicy
from kvcr_policy.errors import ArgumentError, CapacityError, ClosedError, IndicesError
from kvcr_policy.strategies import Evictable, EvictionPolicy

__all__ = [
    "EVICTION_POLICIES",
    "Claim",
    "EvictionPolicy",
    "FIFOPolicy",
    "LRUPolicy",
    "Reservation",
    "SlotState",
    "Store",
    "StoreSnapshot",
    "StoreStats",
    "count_extents",
]


_M = TypeVar("_M", bound=Callable[..., Any])


def _changes(method: _M) -> _M:
    """Tell the store's watchers (:meth:`Store.watch`) once ``method`` returned or raised."""

    @functools.wraps(method)
    def changing(self: Store, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        finally:
            for changed in self._watchers:
                changed()

    return cast(_M, changing)


# Evicted keys remembered per store for the metrics' miss reasons (see Store.__init__).
_EVICTED_KEPT = 1 << 16

# One counter for every store in the process, so a Reservation or Claim handed to the wrong
# store finds no open token there and does nothing, instead of acting on a colliding number.
_TOKENS = itertools.count(1)


class SlotState(enum.IntEnum):
    """What a slot holds; see the module docstring for the transitions."""

    FREE = 0
    RESERVED = 1  # a write is in flight; invisible to lookups
    CANCELLED = 2  # reserved, then deleted/cleared: freed (not published) when its write settles
    PUBLISHED = 3  # holds a key visible to lookups
    ORPHANED = 4  # its key was deleted while claimed: freed when the last claim releases


# Plain ints for the hot loops: reading an enum member costs about 0.15 µs, an int global 0.02.
_FREE = int(SlotState.FREE)
_RESERVED = int(SlotState.RESERVED)
_CANCELLED = int(SlotState.CANCELLED)
_PUBLISHED = int(SlotState.PUBLISHED)
_ORPHANED = int(SlotState.ORPHANED)


@dataclass(frozen=True, slots=True, eq=False)
class Reservation:
    """Slots held for one write of a leading run of the requested keys.

    ``keys`` is the covered leading run (``len(keys) < requested`` when capacity ran short).
    Per covered key: ``slots`` is the slot to copy into, or -1 when no copy is needed because the
    key is ``present`` (already published: a set of it is a success) or ``pending`` (another
    write in flight holds it, or it repeats an earlier key of this request).
    """

    token: int
    keys: tuple[str, ...]
    slots: np.ndarray  # int64, read-only
    generations: np.ndarray  # int64, read-only; -1 where slots is -1
    present: tuple[bool, ...]
    pending: tuple[bool, ...]
    requested: int
    held: tuple[int, ...] = ()  # slots of the present keys, kept from eviction until settled

    @property
    def complete(self) -> bool:
        """True when every requested key is covered."""
        return len(self.keys) == self.requested


@dataclass(frozen=True, slots=True, eq=False)
class Claim:
    """Slots of the leading present run of a read, held until :meth:`Store.release`."""

    token: int
    keys: tuple[str, ...]
    slots: np.ndarray  # int64, read-only
    generations: np.ndarray  # int64, read-only
    requested: int
    #: Whether the first requested key past the run was evicted (not absent): for metrics.
    evicted: bool = False
    #: Claimed for keys known distinct (:meth:`Store.claim`): its slots are too.
    distinct: bool = False


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counters of one store. ``used + reserved + free == capacity``; ``used`` counts published
    slots and orphaned ones still claimed; ``extents`` is the number of free runs."""

    capacity: int
    used: int
    reserved: int
    claimed: int
    evictions: int
    hits: int
    misses: int
    extents: int
    free: int
    keys: int


@dataclass(frozen=True, slots=True, eq=False)
class StoreSnapshot:
    """A consistent copy of the store's tables, for audits and tests (costs O(capacity))."""

    published: Mapping[str, int]
    reserving: Mapping[str, int]
    states: np.ndarray  # uint8 SlotState per slot
    generations: np.ndarray  # int64 per slot
    claims: np.ndarray  # int64 claim count per slot
    free_runs: tuple[tuple[int, int], ...]  # (start, length), sorted by start


def _slot_array(slots: Sequence[int]) -> np.ndarray:
    """Ascending distinct ``slots`` (what the free runs hand out) as int64: an arange where they
    are one run, as a write into an emptied tier gets (converting a list of thousands of ints
    cost more than the rest of its reservation's arrays)."""
    n = len(slots)
    if n and slots[-1] - slots[0] == n - 1:
        return np.arange(slots[0], slots[0] + n, dtype=np.int64)
    return np.asarray(slots, dtype=np.int64)


def _frozen(values: Sequence[int] | np.ndarray, dtype: type = np.int64) -> np.ndarray:
    array: np.ndarray = np.array(values, dtype=dtype)
    array.flags.writeable = False
    return array


class Store:
    """Key -> slot index of one pool's DRAM tier (thread-safe; see the module docstring).

    ``eviction`` names a policy in :data:`EVICTION_POLICIES` (``"lru"`` by default, as
    upstream) or is a policy instance owned by this store alone (what the ``eviction``
    strategy makes). ``pool`` names the pool in error messages.
    """

    def __init__(
        self, capacity: int, *, eviction: str | EvictionPolicy = "lru", pool: str = "kv"
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            message = f"store of pool {pool!r}: capacity must be an int >= 1 slot, got {capacity!r}"
            raise ArgumentError(message)
        if isinstance(eviction, str):
            factory = EVICTION_POLICIES.get(eviction)
            if factory is None:
                names = ", ".join(sorted(EVICTION_POLICIES))
                message = (
                    f"store of pool {pool!r}: unknown eviction policy {eviction!r}; "
                    f"expected one of: {names}"
                )
                raise ArgumentError(message)
            eviction = factory()
        self._capacity = capacity
        self._pool = pool
        self._policy = eviction
        self._lock = threading.Lock()
        self._closed = False
        self._index: dict[str, int] = {}  # published key -> slot: the only table lookups read
        self._reserving: dict[str, int] = {}  # key of a write in flight -> its slot
        # Per-slot tables as lists: scalar reads and writes on lists are several times cheaper
        # than on numpy arrays, and every access here is scalar.
        self._owner: list[str | None] = [None] * capacity
        self._state = bytearray(capacity)  # SlotState values; all FREE
        self._generation = np.zeros(capacity, dtype=np.int64)  # read and bumped per call
        self._claims = ClaimCounts(capacity)  # changed many slots per call (numpy)
        # Open reservations holding each slot's key as present: such a key is not evicted
        # before its write settles (a set cut into batches reserves each one on its own, and a
        # later batch must not evict a key an earlier one reported stored).
        # Sparse (few slots are held at once): the slots that must stay are read in bulk.
        self._held: dict[int, int] = {}
        self._free = _FreeExtents(capacity)
        self._open_reservations: set[int] = set()
        self._live_claims: set[int] = set()
        self._reserved = 0
        self._evictions = 0
        self._hits = 0
        self._misses = 0
        # Keys evicted lately, so a miss can say "evicted" rather than "absent"; delete and
        # clear forget them. Bounded (.recent: oldest dropped first): a few MiB of keys at most.
        self._evicted = RecentKeys(min(capacity, _EVICTED_KEPT))
        self._watchers: list[Callable[[], None]] = []

    @property
    def capacity(self) -> int:
        """Number of slots in the tier."""
        return self._capacity

    @property
    def eviction(self) -> str:
        """The name of the eviction policy in use."""
        return str(getattr(self._policy, "name", type(self._policy).__name__))

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._closed

    # ---- writes ---------------------------------------------------------------------------

    @_changes
    def reserve(
        self, keys: Sequence[str], keep: Collection[str] = (), distinct: bool = False
    ) -> Reservation:
        """Hold slots for the keys that are neither published nor being written.

        Consecutive keys get one contiguous run of slots when one is free. When free slots are
        short, published unclaimed keys are evicted by the policy (never the present keys of
        this request, nor those of ``keep``, the other keys of a request reserved part by part
        (a peer's batches), nor those of another reservation still open). When even that is short,
        the reservation covers the longest leading run of ``keys`` that fits (prefix
        semantics, as HiCache uses only the leading successes).

        ``distinct``: the caller guarantees no key twice (a backend's call, see
        :mod:`kvcr_policy.backends.base`), so repeats are not looked for.

        Raises:
            CapacityError: the first key needs a slot and none can be had (every slot is
                reserved, claimed or protected), so the reservation would cover nothing.
        """
        with self._lock:
            self._check_open("reserve")
            index, reserving = self._index, self._reserving
            count = len(keys)
            # Probes in C iterators: a write of thousands of small pages reserves them all
            # before its first copy can start.
            # A write of new keys, the common one, finds none: no per-key list to build or scan.
            any_present = not index.keys().isdisjoint(keys)
            present = list(map(index.__contains__, keys)) if any_present else [False] * count
            pending = list(map(reserving.__contains__, keys)) if reserving else [False] * count
            needed: Sequence[int]
            if not any_present and True not in pending and (distinct or len(set(keys)) == count):
                needed = range(count)  # every key new: the common write
            else:
                needed = []  # positions of keys that need a slot
                asked: set[str] = set()
                for position, key in enumerate(keys):
                    if present[position]:
                        continue
                    if pending[position] or key in asked:
                        pending[position] = True
                    else:
                        asked.add(key)
                        needed.append(position)
            protect = (
                {index[key] for key, hit in zip(keys, present, strict=True) if hit}
                if any_present
                else set()
            )
            if keep and self._free.free < len(needed):  # only an eviction looks at ``keep``
                protect.update(index[key] for key in keep if key in index)
            slots = self._obtain(len(needed), protect)
            cover = needed[len(slots)] if len(slots) < len(needed) else count
            if cover == 0 and count:
                self._raise_full(keys[0])
            held = tuple(index[keys[p]] for p in range(cover) if present[p]) if any_present else ()
            counts = self._held
            for slot in held:
                counts[slot] = counts.get(slot, 0) + 1
            placed = needed[: len(slots)]  # slots may be short
            new_keys: Sequence[str]
            if isinstance(placed, range):
                new_keys = keys if len(slots) == count else keys[: len(slots)]
            else:
                new_keys = [keys[p] for p in placed]
            self._occupy(slots, new_keys)
            reserving.update(zip(new_keys, slots, strict=True))
            # A new occupant of each slot (distinct slots): stale tokens must stop matching.
            taken = _slot_array(slots)
            self._generation[taken] += 1
            if isinstance(placed, range):  # every key new: key i in slots[i], all covered
                out_slots, out_generations = taken, self._generation[taken]
            else:
                at = np.asarray(placed, dtype=np.int64)
                out_slots = np.full(cover, -1, dtype=np.int64)
                out_slots[at] = taken
                out_generations = np.full(cover, -1, dtype=np.int64)
                out_generations[at] = self._generation[taken]
            out_slots.flags.writeable = out_generations.flags.writeable = False
            self._reserved += len(slots)
            token = next(_TOKENS)
            self._open_reservations.add(token)
            return Reservation(
                token=token,
                keys=tuple(keys[:cover]),
                slots=out_slots,
                generations=out_generations,
                present=tuple(present[:cover]),
                pending=tuple(pending[:cover]),
                requested=count,
                held=held,
            )

    def _occupy(self, slots: Sequence[int], keys: Sequence[str]) -> None:
        """``slots`` (ascending, distinct) reserved for ``keys``: owners and states set, by
        slice where the slots are one run (what a free run hands out)."""
        n = len(slots)
        if n and slots[-1] - slots[0] == n - 1:
            first = slots[0]
            self._owner[first : first + n] = keys
            self._state[first : first + n] = bytes((_RESERVED,)) * n
            return
        owner = self._owner
        for slot, key in zip(slots, keys, strict=True):
            owner[slot] = key
        np.frombuffer(self._state, dtype=np.uint8)[np.asarray(slots, dtype=np.int64)] = _RESERVED

    @_changes
    def commit(self, reservation: Reservation, ok: Sequence[bool] | np.ndarray) -> int:
        """Publish the reserved keys whose write succeeded (``ok`` per covered key; entries for
        keys without a slot are ignored) and free the other slots. Returns how many keys it
        published (not those :meth:`publish` published before). Keys deleted or cleared
        meanwhile are not published: their bytes predate the invalidation. A second or late
        commit (after abort, or from another store) does nothing and returns 0.

        For the eviction policy, the covered keys are used in their order: a new key is
        admitted, a key that was present (and still is) is touched; so the policy sees one
        write as it sees the request, key by key (``kvcr-policy plan --trace`` relies on it).
        """
        if len(ok) != len(reservation.keys):
            message = (
                f"store of pool {self._pool!r}: commit got {len(ok)} ok flags for a reservation "
                f"covering {len(reservation.keys)} keys; pass one flag per key of "
                "reservation.keys"
            )
            raise ArgumentError(message)
        with self._lock:
            self._check_open("commit")
            return self._settle(reservation, ok)

    @_changes
    def publish(self, reservation: Reservation, positions: np.ndarray | Sequence[int]) -> int:
        """Publish now the reserved keys at ``positions`` (of ``reservation.keys``), whose pages
        arrived, before the reservation is committed; returns how many were published.

        A write of many batches publishes each batch as it lands, so the commit after its last
        copy has only that batch left: on one H100, committing the 8,192 keys of a 2 GiB store
        took 5.8 ms after its last copy, the copy engines idle. :meth:`commit` then publishes or
        frees the rest; keys published here stay published, also through an abort.

        Only a reservation of new keys takes part: one that holds present keys is committed
        whole, so the policy sees its admits and touches in the keys' order (0, as after the
        commit or an abort). Keys deleted or cleared meanwhile are not published.
        """
        with self._lock:
            self._check_open("publish")
            if reservation.token not in self._open_reservations or True in reservation.present:
                return 0
            at = np.asarray(positions, dtype=np.int64)
            slots = reservation.slots[at]
            valid = slots >= 0
            at, taken = at[valid], slots[valid]
            same = self._generation[taken] == reservation.generations[at]
            at, taken = at[same], taken[same]
            states = np.frombuffer(self._state, dtype=np.uint8)
            reserved = states[taken] == _RESERVED
            published = self._publish(reservation.keys, at[reserved], taken[reserved])
            self._reserved -= published
            return published

    def _publish(
        self, keys: Sequence[str], positions: np.ndarray, taken: np.ndarray, every: bool = False
    ) -> int:
        """The reserved ``keys`` at ``positions``, in slots ``taken``, published: out of the
        reservations in flight, into the index, admitted by the policy in that order.
        ``every``: the positions are all of them, in order (a commit whose every page arrived)."""
        new_keys = keys if every else [keys[i] for i in positions.tolist()]
        collections.deque(map(self._reserving.__delitem__, new_keys), maxlen=0)
        new_slots = taken.tolist()
        self._index.update(zip(new_keys, new_slots, strict=True))
        np.frombuffer(self._state, dtype=np.uint8)[taken] = _PUBLISHED
        admit_many = getattr(self._policy, "admit_many", None)
        if admit_many is not None:
            admit_many(new_slots, new_keys)
        else:
            collections.deque(map(self._policy.admit, new_slots, new_keys), maxlen=0)
        return len(new_slots)

    @_changes
    def abort(self, reservation: Reservation) -> None:
        """Free every slot of the reservation; a late or repeated abort does nothing."""
        with self._lock:
            self._check_open("abort")
            self._settle(reservation, None)

    # ---- reads ----------------------------------------------------------------------------

    def contains_prefix(self, keys: Sequence[str]) -> int:
        """Number of consecutive published keys from the start of ``keys``."""
        with self._lock:
            self._check_open("contains_prefix")
            # takewhile + list run in C and stop at the first miss: one dict probe per key.
            return len(list(itertools.takewhile(self._index.__contains__, keys)))

    def lookup(self, keys: Sequence[str]) -> np.ndarray:
        """Slot of every key (int64), -1 where the key is not published."""
        with self._lock:
            self._check_open("lookup")
            return self._slots_of(keys)

    def peek(self, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Slots and generations of the leading run of published ``keys``, claiming, counting
        and touching nothing: what a read may start copying before its claim. A claim that
        later finds the same slots with the same generations finds the same bytes (a slot is
        written only after a reservation, which moves its generation on)."""
        with self._lock:
            self._check_open("peek")
            found = self._slots_of(keys)
            absent = np.flatnonzero(found < 0)
            slots = found[: absent[0]] if len(absent) else found
            return slots, self._generation[slots]

    def _slots_of(self, keys: Sequence[str]) -> np.ndarray:
        values = map(self._index.get, keys, itertools.repeat(-1))
        return np.fromiter(values, dtype=np.int64, count=len(keys))

    @_changes
    def claim(self, keys: Sequence[str], distinct: bool = False) -> Claim:
        """Claim the slots of the leading run of published keys for a read.

        Claimed slots are not evicted, overwritten or freed until :meth:`release`. The claim
        counts as a use for the eviction policy, and its keys as hits, the rest as misses.
        ``distinct``: the caller guarantees no key twice (a backend's call, see
        :mod:`kvcr_policy.backends.base`), so the claim counts skip a sort both ways.
        """
        with self._lock:
            self._check_open("claim")
            # C iterators and array operations, not a loop per key: this runs under the
            # lock before a read's first copy can start.
            found = self._slots_of(keys)
            absent = np.flatnonzero(found < 0)
            slots_array = found[: absent[0]] if len(absent) else found
            run = keys[: len(slots_array)]
            slots = slots_array.tolist()
            self._claims.add(slots_array, distinct)
            touch_many = getattr(self._policy, "touch_many", None)
            if touch_many is not None:
                touch_many(slots)
            else:
                collections.deque(map(self._policy.touch, slots), maxlen=0)
            self._hits += len(run)
            self._misses += len(keys) - len(run)
            token = next(_TOKENS)
            self._live_claims.add(token)
            generations = self._generation[slots_array]
            slots_array.flags.writeable = generations.flags.writeable = False
            return Claim(
                token=token,
                keys=tuple(run),
                slots=slots_array,
                generations=generations,
                requested=len(keys),
                evicted=len(run) < len(keys) and keys[len(run)] in self._evicted,
                distinct=distinct,
            )

    @_changes
    def release(self, claim: Claim) -> None:
        """End a claim. Idempotent per Claim; an entry whose slot has a newer generation is
        skipped, so a late completion never releases a newer occupant's claim."""
        with self._lock:
            self._check_open("release")
            if claim.token not in self._live_claims:
                return
            self._live_claims.discard(claim.token)
            slots = claim.slots
            if len(slots) == 0:
                return
            # An entry whose slot has a newer occupant is skipped; the rest in a few array
            # operations (this runs under the lock after a read's last copy).
            current = slots[self._generation[slots] == claim.generations]
            emptied = self._claims.remove(current, claim.distinct)
            if len(emptied):
                states = np.frombuffer(self._state, dtype=np.uint8)
                orphaned = emptied[states[emptied] == _ORPHANED]
                if len(orphaned):
                    states[orphaned] = _FREE
                    self._free.give(orphaned.tolist())

    # ---- removal --------------------------------------------------------------------------

    @_changes
    def delete(self, keys: Iterable[str]) -> int:
        """Remove keys; returns how many published keys were removed. A claimed key vanishes
        from lookups now and its slot is freed by the last release; a key being written is
        cancelled (its commit will not publish it)."""
        with self._lock:
            self._check_open("delete")
            return self._remove(list(keys))

    @_changes
    def clear(self) -> int:
        """Remove every key (as :meth:`delete` of all of them); returns how many were published."""
        with self._lock:
            self._check_open("clear")
            self._evicted.clear()
            return self._remove([*self._index, *self._reserving])

    @_changes
    def evict(self, count: int) -> int:
        """Evict up to ``count`` unclaimed published keys in policy order (not those an open
        reservation holds as present); returns how many."""
        with self._lock:
            self._check_open("evict")
            return self._evict(count, frozenset())

    def victims(self, count: int, keep: Sequence[str] = ()) -> list[str]:
        """The keys the policy would evict next to free ``count`` slots (unclaimed, not held
        by an open reservation, none of ``keep``: the keys of the write to come), evicting
        nothing: what a tier in front of another demotes before a write evicts them."""
        with self._lock:
            self._check_open("victims")
            kept = {int(slot) for slot in self._slots_of(keep) if slot >= 0} if keep else set()
            chosen = self._policy.victims(count, self._evictable(kept))
            return [key for key in map(self._owner.__getitem__, chosen) if key is not None]

    # ---- state ----------------------------------------------------------------------------

    def watch(self, changed: Callable[[], None]) -> None:
        """Call ``changed()`` after every call that may change the slots' states (reserve,
        commit, abort, claim, release, delete, clear, evict), outside the lock, on the calling
        thread: gauges of claims and bytes in use follow each change, not the next request."""
        self._watchers.append(changed)

    @contextmanager
    def idle(self, operation: str) -> Iterator[None]:
        """Hold the store while every slot is free: no write reserves and no read claims a slot
        until the block ends. For ``operation``, which overwrites the tier's bytes (a probe of
        the store direction): an IndicesError while any slot is stored, reserved or claimed."""
        with self._lock:
            self._check_open(operation)
            taken = self._capacity - self._free.free
            if taken:
                message = (
                    f"{operation}: {taken} of the tier's {self._capacity} slots are stored, "
                    "reserved or claimed, and it overwrites the tier's first bytes; clear the "
                    "tier and let its calls end first"
                )
                raise IndicesError(message)
            yield

    def stats(self) -> StoreStats:
        """Current counters."""
        with self._lock:
            self._check_open("stats")
            free = self._free.free
            return StoreStats(
                capacity=self._capacity,
                used=self._capacity - free - self._reserved,
                reserved=self._reserved,
                claimed=self._claims.claimed,
                evictions=self._evictions,
                hits=self._hits,
                misses=self._misses,
                extents=len(self._free),
                free=free,
                keys=len(self._index),
            )

    def snapshot(self) -> StoreSnapshot:
        """A consistent copy of every table (O(capacity): for audits and tests, not hot paths)."""
        with self._lock:
            self._check_open("snapshot")
            return StoreSnapshot(
                published=MappingProxyType(dict(self._index)),
                reserving=MappingProxyType(dict(self._reserving)),
                states=_frozen(self._state, np.uint8),
                generations=_frozen(self._generation),
                claims=_frozen(self._claims.counts),
                free_runs=self._free.runs(),
            )

    def close(self) -> None:
        """Refuse every later call with ClosedError; idempotent. The pipeline closes a store
        only after its transfers finished, so outstanding tokens need no settling."""
        with self._lock:
            self._closed = True

    # ---- internals (caller holds the lock) --------------------------------------------------

    def _check_open(self, operation: str) -> None:
        if self._closed:
            message = (
                f"store of pool {self._pool!r} is closed: {operation}() cannot run after "
                "close(); build a new pipeline to use the tier again"
            )
            raise ClosedError(message)

    def _raise_full(self, key: str) -> None:
        message = (
            f"store of pool {self._pool!r}: no slot for key {key!r}: all {self._capacity} slots "
            f"are reserved by writes in flight ({self._reserved}), claimed by reads in flight "
            f"({self._claims.claimed}) or hold present keys of this or another write in flight; "
            "retry after transfers complete, or give the tier more slots"
        )
        raise CapacityError(message)

    def _obtain(self, count: int, protect: set[int] | frozenset[int]) -> Sequence[int]:
        """Up to ``count`` slots, evicting as needed; fewer when not enough can be freed."""
        if self._free.free < count:
            self._evict(count - self._free.free, protect)
        return self._free.take(min(count, self._free.free))

    def _evictable(self, protect: set[int] | frozenset[int]) -> Evictable:
        """Which slots the policy may evict: none claimed, held by an open reservation or in
        ``protect``; the slots that must stay are gathered once, for bulk filtering."""
        busy = set(protect)
        if self._claims.claimed:
            busy.update(np.flatnonzero(self._claims.counts).tolist())
        busy.update(self._held)
        return Evictable(frozenset(busy))

    def _evict(self, count: int, protect: set[int] | frozenset[int]) -> int:
        victims = self._policy.victims(count, self._evictable(protect))
        if not victims:
            return 0
        owner = self._owner
        # A published slot has an owner.
        keys = cast(list[str], list(map(owner.__getitem__, victims)))
        self._evicted.add(keys)
        collections.deque(map(self._index.__delitem__, keys), maxlen=0)
        collections.deque(map(owner.__setitem__, victims, itertools.repeat(None)), maxlen=0)
        forget_many = getattr(self._policy, "forget_many", None)
        if forget_many is not None:
            forget_many(victims)
        else:
            collections.deque(map(self._policy.forget, victims), maxlen=0)
        np.frombuffer(self._state, dtype=np.uint8)[np.asarray(victims, dtype=np.int64)] = _FREE
        self._free.give(victims)
        self._evictions += len(victims)
        return len(victims)

    def _unpublish(self, slot: int) -> None:
        key = self._owner[slot]
        assert key is not None
        del self._index[key]
        self._owner[slot] = None
        self._policy.forget(slot)

    def _remove(self, keys: Sequence[str]) -> int:
        index, reserving, state = self._index, self._reserving, self._state
        claims = self._claims.counts
        freed: list[int] = []
        removed = 0
        evicted = self._evicted
        for key in keys:
            evicted.discard(key)
            slot = index.get(key)
            if slot is not None:
                self._unpublish(slot)
                removed += 1
                if claims[slot]:
                    state[slot] = _ORPHANED
                else:
                    state[slot] = _FREE
                    freed.append(slot)
                continue
            slot = reserving.pop(key, None)
            if slot is not None:
                # The writer may still be copying into this slot, so it stays held until
                # that write settles; only then may another occupant have it.
                state[slot] = _CANCELLED
                self._owner[slot] = None
        self._free.give(freed)
        return removed

    def _settle(self, reservation: Reservation, ok: Sequence[bool] | np.ndarray | None) -> int:
        if reservation.token not in self._open_reservations:
            return 0
        self._open_reservations.discard(reservation.token)
        counts = self._held
        for slot in reservation.held:
            left = counts[slot] - 1
            if left:
                counts[slot] = left
            else:
                del counts[slot]
        if ok is not None and True in reservation.present:
            # A commit with present keys to use: the policy sees admits and touches
            # interleaved, in the keys' order, so one key at a time.
            return self._settle_each(reservation, ok)
        keys, slots = reservation.keys, reservation.slots
        positions = np.flatnonzero(slots >= 0)
        taken = slots[positions]
        # Belt and braces: an open reservation's slots cannot have changed hands, but a slot
        # whose generation moved on belongs to someone else and is left alone.
        same = self._generation[taken] == reservation.generations[positions]
        positions, taken = positions[same], taken[same]
        states = np.frombuffer(self._state, dtype=np.uint8)
        current = states[taken]
        reserved = current == _RESERVED
        arrived = (
            np.zeros(len(positions), dtype=bool)
            if ok is None
            else np.asarray(ok, dtype=bool)[positions]
        )
        publish = reserved & arrived
        if publish.all() and len(positions) == len(keys):  # every key, in order: none to free
            published = self._publish(keys, positions, taken, every=True)
            self._reserved -= published
            return published
        published = self._publish(keys, positions[publish], taken[publish])
        dropped = reserved & ~arrived
        collections.deque(
            map(self._reserving.__delitem__, map(keys.__getitem__, positions[dropped].tolist())),
            maxlen=0,
        )
        freed = taken[dropped | (current == _CANCELLED)]
        owner = self._owner
        collections.deque(
            map(owner.__setitem__, taken[dropped].tolist(), itertools.repeat(None)), maxlen=0
        )
        states[freed] = _FREE
        self._reserved -= published + len(freed)
        self._free.give(freed.tolist())
        return published

    def _settle_each(self, reservation: Reservation, ok: Sequence[bool] | np.ndarray) -> int:
        """:meth:`_settle` key by key, for a commit that touches present keys."""
        if isinstance(ok, np.ndarray):
            ok = ok.tolist()  # indexing a list is several times cheaper than an array
        state, owner = self._state, self._owner
        index, reserving, admit = self._index, self._reserving, self._policy.admit
        touch, present = self._policy.touch, reservation.present
        keys, taken = reservation.keys, reservation.slots
        # Per position, whether its slot still has the occupant the reservation saw.
        same = (self._generation[np.maximum(taken, 0)] == reservation.generations).tolist()
        freed: list[int] = []
        published = 0
        for position, slot in enumerate(reservation.slots.tolist()):
            if slot < 0:
                if present[position]:
                    # A set of a present key is a use, if it still is. Not suppress(): a
                    # context manager per key costs more than the touch on this hot path.
                    try:  # noqa: SIM105
                        touch(index[keys[position]])
                    except KeyError:  # deleted or evicted since the reserve
                        pass
                continue
            if not same[position]:
                continue
            current = state[slot]
            if current == _RESERVED:
                key = keys[position]
                del reserving[key]
                if ok[position]:
                    index[key] = slot
                    state[slot] = _PUBLISHED
                    admit(slot, key)
                    published += 1
                    continue
                owner[slot] = None
            elif current != _CANCELLED:
                continue
            state[slot] = _FREE
            freed.append(slot)
        self._reserved -= published + len(freed)
        self._free.give(freed)
        return published
