"""KeySpace: the pipeline's keys as KVCR block keys, with delete and clear.

KVCR (0.1.1) cannot remove a block, so a key that is deleted or cleared must never be found
again, and a later store of the same key must not be mistaken for the old block (KVCR answers a
deposit of a block it holds with success, without copying). Each block key is therefore
``b"<epoch>:<incarnation>:<key>"`` (``b"s<epoch>:..."`` for a staged pool, whose blocks are one
element per page: the other form never finds them, see :mod:`.staging`): ``clear`` starts a new
epoch, ``delete`` a new incarnation of each deleted key. The old blocks become unreachable at
once and are evicted first (:class:`~kvcr_policy_kvcr.policy.TierPolicy`). Only deleted keys are
remembered (one int each, until the next ``clear``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

__all__ = ["KeySpace"]


class KeySpace:
    """Block keys of one pool's runner; thread-safe."""

    def __init__(self, staged: bool = False) -> None:
        self._form = b"s" if staged else b""
        self._epoch = 0
        self._incarnations: dict[str, int] = {}
        self._lock = threading.Lock()
        self._prefix = self._form + b"0:"
        self._first = self._prefix + b"0:"

    @property
    def live_prefix(self) -> bytes:
        """Every live block key starts with it."""
        return self._prefix

    def block_keys(self, keys: Sequence[str]) -> list[bytes]:
        with self._lock:
            first, prefix, again = self._first, self._prefix, self._incarnations
            if not again:
                return [first + key.encode("utf-8", "surrogatepass") for key in keys]
            return [
                prefix + b"%d:" % again.get(key, 0) + key.encode("utf-8", "surrogatepass")
                for key in keys
            ]

    def forget(self, keys: Sequence[str]) -> None:
        """Start a new incarnation of each of ``keys`` (after they were deleted)."""
        with self._lock:
            for key in keys:
                self._incarnations[key] = self._incarnations.get(key, 0) + 1

    def clear(self) -> None:
        """A new epoch: every block key handed out so far is dead."""
        with self._lock:
            self._epoch += 1
            self._incarnations.clear()
            self._prefix = self._form + b"%d:" % self._epoch
            self._first = self._prefix + b"0:"
