"""The arguments of SGLang's tensor (v0) API, read in both forms, and its return values.

``set(key, value=None, target_location=None, target_sizes=None)`` and its three siblings take
either tensors (``value``; ``target_location`` a tensor to fill) or pointers
(``target_location`` an address or a list of addresses, ``target_sizes`` the byte count or a
list of them). This module turns each key's argument into :data:`.flat.Pieces`, checks them,
and answers the way each form's callers expect (SGLang 0.5.23 ``HiCacheFile`` for tensors,
``MooncakeStore`` for pointers):

==============  ==========================  ============================================
call            tensor form                 pointer form
==============  ==========================  ============================================
``set``         True if stored              True if stored
``batch_set``   True if every key stored    True if every key stored
``get``         the filled tensor, or None  True if restored, else False
``batch_get``   tensor or None per key      how many keys from the start were restored
==============  ==========================  ============================================

A key whose argument cannot be used (not a CPU tensor, a non-contiguous target, sizes that do
not match, an address outside every registered host pool) is logged and fails alone.
:class:`TensorCalls` holds the four calls (and ``exists``) as the backend's methods.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ...errors import ArgumentError, KVCRPolicyError
from ...values import shorten
from .flat import FlatObjects, Pieces
from .memory import MemoryMap

__all__ = ["TensorAPI", "TensorCalls"]

log = logging.getLogger("kvcr_policy.integrations.sglang")


def _is_address(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


#: Largest address or size taken (int64's: every check after this one is in int64).
_MAX_INT = (1 << 63) - 1


def _ints(value: Any, what: str) -> list[int]:
    values = [value] if _is_address(value) else list(value)
    if not values or not all(_is_address(v) and 0 <= int(v) <= _MAX_INT for v in values):
        message = f"{what}: expected an int in 0..2**63-1 or a list of them, got {shorten(value)}"
        raise ArgumentError(message)
    return [int(v) for v in values]


def _tensor(value: Any, target_size: Any, *, writes: bool) -> tuple[Pieces, torch.Tensor]:
    if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
        got = (
            f"{type(value).__name__} on {value.device}"
            if isinstance(value, torch.Tensor)
            else (type(value).__name__)
        )
        raise ArgumentError(f"expected a CPU tensor or an address, got {got}")
    if not value.is_contiguous():
        if writes:
            raise ArgumentError(f"target tensor {tuple(value.shape)} is not contiguous")
        value = value.contiguous()
    nbytes = value.numel() * value.element_size()
    if target_size is not None and sum(_ints(target_size, "target_sizes")) != nbytes:
        raise ArgumentError(f"target_sizes {target_size!r} != the tensor's {nbytes} bytes")
    if nbytes == 0:
        raise ArgumentError("an empty tensor holds no page")
    pieces = (np.array([value.data_ptr()], dtype=np.int64), np.array([nbytes], dtype=np.int64))
    return pieces, value


class TensorAPI:
    """``set``/``get``/``batch_set``/``batch_get`` over :class:`.flat.FlatObjects`."""

    def __init__(
        self,
        objects: FlatObjects,
        memory: Callable[[], MemoryMap],
        page_bytes: Callable[[], int | None],
    ) -> None:
        self._objects = objects
        self._memory = memory
        self._page_bytes = page_bytes

    def _pointer(self, location: Any, size: Any, key: str) -> Pieces:
        if size is None:
            raise ArgumentError("an address needs target_sizes (its byte count)")
        addresses, sizes = _ints(location, "target_location"), _ints(size, "target_sizes")
        if len(addresses) != len(sizes):
            message = f"{len(addresses)} addresses but {len(sizes)} target_sizes"
            raise ArgumentError(message)
        pieces = np.array(addresses, dtype=np.int64), np.array(sizes, dtype=np.int64)
        self._memory().check(f"key {key!r}", *pieces)
        return pieces

    def _read(
        self, keys: Sequence[str], locations: Sequence[Any], sizes: Sequence[Any], writes: bool
    ) -> tuple[list[int], list[Pieces], list[torch.Tensor | None]]:
        """The usable keys' positions, pieces and tensors (None in pointer form)."""
        kept, pieces, tensors = [], [], []
        for i, key in enumerate(keys):
            location = locations[i] if i < len(locations) else None
            size = sizes[i] if i < len(sizes) else None
            try:
                if location is None and writes:
                    nbytes = (sum(_ints(size, "target_sizes")) if size is not None
                              else self._page_bytes())  # fmt: skip
                    if nbytes is None:
                        raise ArgumentError("no target and no page size to allocate one")
                    if self._objects.pool(nbytes, create=False) is None:
                        # Nothing of that size was stored: a miss, before allocating its bytes.
                        raise ArgumentError(f"no object of {nbytes} bytes was stored")
                    location = torch.empty(nbytes, dtype=torch.uint8)
                    size = None
                if (
                    location is None
                    or _is_address(location)
                    or (
                        isinstance(location, (list, tuple))
                        and location
                        and _is_address(location[0])
                    )
                ):
                    piece, tensor = self._pointer(location, size, key), None
                else:
                    piece, tensor = _tensor(location, size, writes=writes)
            except (KVCRPolicyError, TypeError) as err:
                log.warning("kvcr_policy: tensor API, key %r: %s; this key fails", key, err)
                if writes:
                    break  # reads count the leading run only
                continue
            kept.append(i)
            pieces.append(piece)
            tensors.append(tensor)
        return kept, pieces, tensors

    def batch_set(self, keys: Sequence[str], values: Any, locations: Any, sizes: Any) -> list[bool]:
        keys = list(keys)
        sources = list(values) if values is not None else list(locations or [])
        size_list = _per_key(sizes, len(keys))
        kept, pieces, _ = self._read(keys, sources, size_list, writes=False)
        ok = [False] * len(keys)
        done = self._objects.set([keys[i] for i in kept], pieces) if kept else []
        for i, good in zip(kept, done, strict=True):
            ok[i] = good
        return ok

    def batch_get(
        self, keys: Sequence[str], locations: Any, sizes: Any
    ) -> tuple[list[bool], list[torch.Tensor | None], bool]:
        """Per key: restored or not, the tensor filled (tensor form), and whether the call
        used the pointer form."""
        keys = list(keys)
        targets = list(locations) if locations is not None else [None] * len(keys)
        size_list = _per_key(sizes, len(keys))
        pointer_form = any(_is_address(t) or isinstance(t, (list, tuple)) for t in targets)
        kept, pieces, tensors = self._read(keys, targets, size_list, writes=True)
        lead = next((n for n, i in enumerate(kept) if i != n), len(kept))
        done = self._objects.get(keys[:lead], pieces[:lead]) if lead else []
        ok = [*done, *[False] * (len(keys) - len(done))]
        filled: list[torch.Tensor | None] = [
            tensors[i] if i < len(done) and done[i] else None for i in range(len(keys))
        ]
        return ok, filled, pointer_form


class TensorCalls:
    """The tensor API's calls of :class:`~.storage.KVCRPolicyStorage` (its v0 half), every
    failure a logged, correctly shaped miss. The backend sets ``_tensors`` and ``_objects``."""

    _tensors: TensorAPI
    _objects: FlatObjects

    def _failed(self, call: str, name: str, n: int, err: Exception) -> None:
        """Log a data-path failure: a kvcr_policy error as a warning, anything else with its
        traceback (a bug)."""
        if isinstance(err, KVCRPolicyError):
            log.warning("kvcr_policy: %s of %d pages of pool %r missed: %s", call, n, name, err)
        else:
            log.exception("kvcr_policy: %s of %d pages of pool %r failed", call, n, name)

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Store one object per key (tensors or pointers); True only if every key is stored."""
        if not keys:
            return True
        try:
            return all(self._tensors.batch_set(keys, values, target_locations, target_sizes))
        except Exception as err:
            self._failed("set", "v0", len(keys), err)
            return False

    def set(
        self,
        key: str,
        value: Any = None,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        values = [value] if value is not None else None
        locations = [target_location] if target_location is not None else None
        sizes = [target_sizes] if target_sizes is not None else None
        return self.batch_set([key], values, locations, sizes)

    def batch_get(
        self,
        keys: list[str],
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> Any:
        """Tensor form: the filled tensor or None per key. Pointer form: how many keys from the
        start were restored (as MooncakeStore answers)."""
        try:
            ok, filled, pointers = self._tensors.batch_get(keys, target_locations, target_sizes)
        except Exception as err:
            self._failed("get", "v0", len(keys), err)
            ok, filled, pointers = [False] * len(keys), [None] * len(keys), False
        if pointers:
            return ok.index(False) if False in ok else len(ok)
        return filled

    def get(
        self,
        key: str,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> Any:
        """Tensor form: the filled tensor or None. Pointer form: True if restored."""
        sizes = [target_sizes] if target_sizes is not None else None
        got = self.batch_get([key], [target_location], sizes)
        return got == 1 if isinstance(got, int) else got[0]

    def exists(self, key: str) -> bool:
        try:
            return self._objects.has(key)
        except Exception as err:
            self._failed("exists", "v0", 1, err)
            return False


def _per_key(sizes: Any, n: int) -> list[Any]:
    """``target_sizes`` per key: a list as given, one value for a single key, else Nones."""
    if sizes is None:
        return [None] * n
    if n == 1 and (
        _is_address(sizes)
        or (isinstance(sizes, (list, tuple)) and sizes and all(_is_address(s) for s in sizes))
    ):
        return [sizes]  # fmt: skip
    return list(sizes)
