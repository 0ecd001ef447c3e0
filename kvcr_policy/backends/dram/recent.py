"""The keys a store evicted lately, bounded: so a miss can say "evicted" rather than "absent".

Two generations of plain dicts: keys are added to the newer one; when it holds ``size`` keys it
becomes the older one and the older is dropped. So the last ``size`` keys added are always
known, and at most about ``2 * size`` (plus one eviction's keys) are kept. Adding thousands of
keys is one C-level ``dict.update``, where an ordered dict trimmed key by key cost a store's
eviction of small pages more than the eviction itself.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["RecentKeys"]


class RecentKeys:
    """See the module docstring. Not thread-safe: the store calls it under its own lock."""

    __slots__ = ("_newer", "_older", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"RecentKeys keeps at least 1 key, got size={size!r}")
        self.size = size
        self._newer: dict[str, None] = {}
        self._older: dict[str, None] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._newer or key in self._older

    def __len__(self) -> int:
        return len(self._newer) + len(self._older)

    def add(self, keys: Iterable[str]) -> None:
        """Remember ``keys`` (a key added again is remembered as recent)."""
        newer = self._newer
        newer.update(dict.fromkeys(keys))
        if len(newer) >= self.size:
            self._older, self._newer = newer, {}

    def discard(self, key: str) -> None:
        self._newer.pop(key, None)
        self._older.pop(key, None)

    def clear(self) -> None:
        self._newer.clear()
        self._older.clear()
