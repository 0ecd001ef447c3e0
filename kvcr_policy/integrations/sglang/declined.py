"""Pages the tier holds but the admission gate declined at lookup: computed, not written again.

SGLang knows nothing of the tier's pages it was not told of: a page the gate left out of a
lookup's hits is computed, and SGLang's backup then writes it to the tier, which already holds
it (a round trip, and on a paced tenant a reservation beside the restores). The backend notes
the keys of every declined run (:meth:`DeclinedPages.note`) and a write leaves them out
(:meth:`DeclinedPages.split`): reported stored, each once, as vLLM's connector does with the
blocks it declined. A key is forgotten once skipped; at most :data:`KEPT` keys are kept, the
oldest forgotten first. A page evicted from the tier between the lookup and the write is then
missing until written again: a later miss, never wrong bytes.

Nothing is added to a write while no key is noted (one length test a call); with keys noted,
one C-level pass over the call's keys (``set.isdisjoint``) before any per-key work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["KEPT", "DeclinedPages", "Write"]

#: A mover's ``set``: ``(keys, token_indices) -> stored per key``.
Write = Callable[[Sequence[str], Any], list[bool]]

#: Declined keys kept at most (a few long prompts' worth; a key is a 64-character digest).
KEPT = 1 << 16


class DeclinedPages:
    """Keys present in the tier that a lookup declined, until written or forgotten;
    thread-safe (SGLang looks up on its prefetch thread and writes on its backup thread)."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._keys: dict[str, None] = {}  # insertion order: the oldest first
        self._lock = threading.Lock()
        #: Pages left out of writes since the backend opened.
        self.skipped = 0

    def __len__(self) -> int:
        return len(self._keys)

    def note(self, keys: Sequence[str]) -> None:
        """``keys`` are in the tier and were declined: a write of them can be left out."""
        if not keys:
            return
        with self._lock:
            for key in keys:
                self._keys.pop(key, None)
                self._keys[key] = None
            over = len(self._keys) - self._kept
            for key in list(self._keys)[: max(over, 0)]:
                del self._keys[key]

    def split(self, keys: Sequence[str]) -> list[bool] | None:
        """Per key of a write, whether it is noted (then forgotten: skipped once); None when
        none is."""
        if not self._keys:  # the common case: nothing declined
            return None
        with self._lock:
            if self._keys.keys().isdisjoint(keys):
                return None
            noted = [self._keys.pop(key, 0) is None for key in keys]
            self.skipped += sum(noted)
        return noted

    def skipping(self, keys: Sequence[str], write: Write) -> Write:
        """``write`` (a mover's ``set(keys, token_indices)``, called with the tier's names of
        ``keys``) leaving out the noted keys, reported stored; ``write`` itself when none is."""
        noted = self.split(keys)
        if noted is None:
            return write

        def unnoted(names: Sequence[str], indices: Any) -> list[bool]:
            n = len(names)
            todo = [i for i, skip in enumerate(noted) if not skip]
            if len(todo) == n or not hasattr(indices, "reshape") or len(indices) % n:
                return write(names, indices)  # nothing to leave out, or the mover's error
            ok = [True] * n
            if todo:
                rows = indices.reshape(n, len(indices) // n)[todo].reshape(-1)
                done = write([names[i] for i in todo], rows)
                for i, good in zip(todo, list(done) + [False] * len(todo), strict=False):
                    ok[i] = bool(good)
            return ok

        return unnoted
