"""The one rule for page keys, checked by the pipeline before any backend sees a call.

- ``keys`` is a list or tuple (any ``Sequence`` but ``str`` and ``bytes``: a string would be
  taken letter by letter); a generator or a set is refused, as its order or length is not
  the caller's to see again.
- Each key is a ``str`` (or a subclass) of 1 to :data:`MAX_KEY_BYTES` bytes in UTF-8, without
  lone surrogates (what the peer tier can carry; the local tier keeps the same rule, so that a
  deployment can move between them).
- A key repeated in one ``set`` is stored once, from the page of its first occurrence, and
  every occurrence reports that outcome. In ``get`` every occurrence is restored into its own
  page. Either way a backend never sees a key twice in one call (:func:`rounds`: the pipeline
  hands it the first occurrences, then for a ``get`` the second ones, and so on); ``exists``
  and ``delete`` take repeats as they come.

A backend that builds composite names (a pool's name in a store's object keys, a file name)
puts each free-text part through :func:`key_part`, so that no part holds a separator and no two
parts give one name.

A key that breaks the rule raises :class:`~kvcr_policy.errors.UsageError` (wrong type) or
:class:`~kvcr_policy.errors.ArgumentError` (wrong value), naming the call, the position and
what was expected. The checks run in C loops (``str.join``, ``map``): about 25 ns per ASCII
key, measured on 100,000 keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import numpy as np

from .errors import ArgumentError, UsageError
from .values import shorten

__all__ = ["MAX_KEY_BYTES", "check_keys", "key_part", "rounds"]

#: Longest key in UTF-8 bytes (the peer wire format's limit: kvcr_policy.backends.peer.wire).
MAX_KEY_BYTES = 1024
#: Keys checked per C pass (at most 4 MiB of characters at a time).
_CHUNK = 4096


def check_keys(keys: Any, call: str) -> list[str]:
    """``keys`` as a list (the same list when it is one), checked against the module's rule."""
    if isinstance(keys, (str, bytes, bytearray)) or not isinstance(keys, Sequence):
        message = (
            f"{call}(): keys must be a list or tuple of str, got {type(keys).__name__} "
            f"{shorten(keys)}"
        )
        raise UsageError(message)
    if type(keys) is not list:
        keys = list(keys)
    if not keys:
        return keys
    try:
        # C passes over chunks (a bounded temporary): join refuses any item not a str. Every
        # chunk is joined (a list, not a short-circuiting all()) so every item is type-checked.
        ascii_chunks = [
            "".join(keys[start : start + _CHUNK]).isascii() for start in range(0, len(keys), _CHUNK)
        ]
    except TypeError:
        position, key = next((i, k) for i, k in enumerate(keys) if not isinstance(k, str))
        message = (
            f"{call}(): key at position {position} must be a str, got {type(key).__name__} "
            f"{shorten(key)}"
        )
        raise UsageError(message) from None
    if all(ascii_chunks):  # one byte per character, no surrogate: sizes are lengths
        lengths = set(map(len, keys))  # the distinct lengths: one C pass, a small set
        if not 1 <= min(lengths) <= max(lengths) <= MAX_KEY_BYTES:
            sizes = list(map(len, keys))
        else:
            sizes = []
    else:
        sizes = [_utf8_size(call, i, k) for i, k in enumerate(keys)]
    for position, size in enumerate(sizes):
        if not 1 <= size <= MAX_KEY_BYTES:
            message = (
                f"{call}(): key at position {position} has {size} bytes in UTF-8; a key "
                f"has 1 to {MAX_KEY_BYTES} (hash a longer one): {shorten(keys[position])}"
            )
            raise ArgumentError(message)
    return keys


def _utf8_size(call: str, position: int, key: str) -> int:
    try:
        return len(key.encode("utf-8"))
    except UnicodeEncodeError:
        message = f"{call}(): key at position {position} is not valid Unicode: {shorten(key)}"
        raise ArgumentError(message) from None


def rounds(keys: list[str]) -> list[np.ndarray] | None:
    """Positions of each key's first occurrences, then of its second ones, ...: in each round
    a key appears once. None when no key repeats."""
    if len(set(keys)) == len(keys):
        return None
    seen: dict[str, int] = {}
    occurrence = np.empty(len(keys), dtype=np.int64)
    for position, key in enumerate(keys):
        occurrence[position] = seen.get(key, 0)
        seen[key] = occurrence[position] + 1
    return [np.flatnonzero(occurrence == n) for n in range(int(occurrence.max()) + 1)]


def key_part(text: str) -> str:
    """``text`` as one part of a composite key or name: percent-encoded (RFC 3986, UTF-8) but
    for ``A-Z a-z 0-9 _ . - ~``, so it holds no separator (``@ / # : ; = %`` and the rest) and
    two texts never give one part. A text of those characters alone is unchanged (``kv``,
    ``v0.4096``); a lone surrogate is encoded as its bytes, not refused."""
    return quote(text, safe="", errors="surrogatepass")
