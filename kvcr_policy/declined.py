"""Pages the tier holds but a lookup's admission declined: computed, so not written again.

An engine knows nothing of the tier's pages it was not told of: a page the admission gate left
out of a lookup's hits is computed, and the engine's next write of it would send the tier a
page it holds (a round trip, and on a paced tenant a reservation beside the restores). The
pipeline's admission (:class:`~.admission.AdmissionDesk`, from
:meth:`~.pipeline.Pipeline.admit` given the lookup's keys) notes the declined keys of each pool
the lookup was for (:meth:`DeclinedKeys.note`); an engine integration's write leaves them out
(:meth:`DeclinedKeys.split`, :meth:`DeclinedKeys.skipping`), reported stored, each once. A key
is forgotten once skipped; at most :data:`KEPT` keys are kept, the oldest forgotten first. A
page evicted from the tier between the lookup and the write is then missing until written
again: a later miss, never wrong bytes.

Nothing is added to a write while no key is noted (one emptiness test a call); with keys
noted, one C-level pass over the call's keys (``isdisjoint``) before any per-key work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["KEPT", "DeclinedKeys", "Write"]

#: A write of an engine's pages: ``(keys, indices) -> stored per key``, where ``indices``
#: holds an equal number of rows (token indices) per key.
Write = Callable[[Sequence[str], Any], list[bool]]

#: Declined keys kept at most, over all pools (a few long prompts' worth; a key is a
#: 64-character digest).
KEPT = 1 << 16


class DeclinedKeys:
    """Keys present in a pool of the tier that a lookup declined, until written or forgotten;
    thread-safe (engines look up and write on threads of their own)."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._keys: dict[tuple[str, str], None] = {}  # insertion order: the oldest first
        self._lock = threading.Lock()
        #: Pages left out of writes since the pipeline opened.
        self.skipped = 0

    def __len__(self) -> int:
        return len(self._keys)

    def note(self, pools: Sequence[str], keys: Sequence[str]) -> None:
        """``keys`` are in each of ``pools`` and were declined: a write of them can be left
        out."""
        if not keys:
            return
        with self._lock:
            for pool in pools:
                for key in keys:
                    self._keys.pop((pool, key), None)
                    self._keys[pool, key] = None
            over = len(self._keys) - self._kept
            for named in list(self._keys)[: max(over, 0)]:
                del self._keys[named]

    def split(self, pool: str, keys: Sequence[str]) -> list[bool] | None:
        """Per key of a write to ``pool``, whether it is noted (then forgotten: skipped
        once); None when none is."""
        if not self._keys:  # the common case: nothing declined
            return None
        named = [(pool, key) for key in keys]
        with self._lock:
            if self._keys.keys().isdisjoint(named):
                return None
            noted = [self._keys.pop(key, 0) is None for key in named]
            self.skipped += sum(noted)
        return noted

    def skipping(self, pool: str, keys: Sequence[str], write: Write) -> Write:
        """``write`` (called with the tier's names of ``keys`` and their rows of indices)
        leaving out the keys noted for ``pool``, reported stored; ``write`` itself when none
        is."""
        noted = self.split(pool, keys)
        if noted is None:
            return write

        def unnoted(names: Sequence[str], indices: Any) -> list[bool]:
            n = len(names)
            todo = [i for i, skip in enumerate(noted) if not skip]
            if len(todo) == n or not hasattr(indices, "reshape") or len(indices) % n:
                return write(names, indices)  # nothing to leave out, or the writer's error
            ok = [True] * n
            if todo:
                rows = indices.reshape(n, len(indices) // n)[todo].reshape(-1)
                done = write([names[i] for i in todo], rows)
                for i, good in zip(todo, list(done) + [False] * len(todo), strict=False):
                    ok[i] = bool(good)
            return ok

        return unnoted
