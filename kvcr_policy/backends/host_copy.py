"""The host copy primitive: every descriptor of a batch in one native call, or ctypes as fallback.

The native loop (``kvcr_policy._copy``, built from ``_copy.c`` when a C compiler is present at
install) releases the GIL once per batch instead of once per descriptor and can copy large
descriptors with non-temporal stores (``transport.stream_min_bytes``). Without it, each
descriptor is one ``ctypes.memmove`` call (the GIL is released per call), which is correct but
costs about 0.3 µs a descriptor.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import Any

from kvcr_policy.descriptors import Descriptors

__all__ = ["NATIVE", "STREAM", "copy_descriptors"]

_copy: Any
try:
    _copy = importlib.import_module("kvcr_policy._copy")
except ImportError:  # no compiler at install time: the ctypes loop below is used
    _copy = None

#: Whether the native loop is in use.
NATIVE: bool = _copy is not None
#: Whether non-temporal stores are available (x86-64 with the native loop).
STREAM: bool = bool(NATIVE and _copy.HAVE_STREAM)

_memmove = ctypes.memmove


def copy_descriptors(dst_base: int, src_base: int, d: Descriptors, stream_from: int = 0) -> None:
    """Copy ``src_base + d.src[i]`` to ``dst_base + d.dst[i]`` for ``d.length[i]`` bytes, all i.

    Copies of at least ``stream_from`` bytes (0: none) use non-temporal stores where available;
    overlapping ranges always get memmove semantics. Bounds are the caller's to check.
    """
    if _copy is not None:
        _copy.copy_many(dst_base, src_base, d.dst, d.src, d.length, stream_from)
        return
    sources, targets = (d.src + src_base).tolist(), (d.dst + dst_base).tolist()
    for s, t, n in zip(sources, targets, d.length.tolist(), strict=True):
        _memmove(t, s, n)
