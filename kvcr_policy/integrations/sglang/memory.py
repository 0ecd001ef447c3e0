"""Which memory a host pool owns, so that a pointer it hands out is checked before any copy.

The generic paths copy to and from raw addresses an SGLang object returned
(``get_page_buffer_meta``, or ``target_location`` in the tensor API's pointer form). A wrong
address would be silent corruption or a crash, so every range is checked against the CPU tensors
the pool itself holds (their whole storage, found among its attributes, one level of lists,
tuples and dicts deep) before a byte moves. A range outside all of them is refused, naming the
address, and the call becomes a miss.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ...errors import PoolError

__all__ = ["MemoryMap"]

Int64Array = npt.NDArray[np.int64]


def _tensors(value: Any) -> Iterator[Any]:
    torch = sys.modules.get("torch")
    if torch is None:
        return
    items: Iterable[Any]
    if isinstance(value, torch.Tensor):
        items = (value,)
    elif isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, dict):
        items = value.values()
    else:
        return
    for item in items:
        if isinstance(item, torch.Tensor) and item.device.type == "cpu" and item.numel():
            yield item


@dataclass(frozen=True, slots=True)
class MemoryMap:
    """Sorted, merged ``[start, end)`` byte ranges: the memory a pool may be copied from/to."""

    starts: Int64Array
    ends: Int64Array

    @classmethod
    def of(cls, *owners: Any) -> MemoryMap:
        """The CPU tensor storages among the attributes of ``owners`` (tensors are their own)."""
        ranges: list[tuple[int, int]] = []
        for owner in owners:
            values = [owner] if not hasattr(owner, "__dict__") else list(vars(owner).values())
            for value in values:
                for tensor in _tensors(value):
                    storage = tensor.untyped_storage()
                    ranges.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        return cls.merged(ranges)

    @classmethod
    def merged(cls, ranges: Iterable[tuple[int, int]]) -> MemoryMap:
        merged: list[list[int]] = []
        for start, end in sorted(r for r in ranges if r[1] > r[0]):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        starts = np.array([r[0] for r in merged], dtype=np.int64)
        ends = np.array([r[1] for r in merged], dtype=np.int64)
        return cls(starts, ends)

    def __or__(self, other: MemoryMap) -> MemoryMap:
        pairs = zip(
            [*self.starts.tolist(), *other.starts.tolist()],
            [*self.ends.tolist(), *other.ends.tolist()],
            strict=True,
        )
        return MemoryMap.merged(pairs)

    @property
    def nbytes(self) -> int:
        return int((self.ends - self.starts).sum())

    def check(self, owner: str, pointers: Int64Array, sizes: Int64Array) -> None:
        """Raise :class:`PoolError` unless every ``[pointer, +size)`` lies in one range."""
        if not len(pointers):
            return
        if len(self.starts):
            slot = np.searchsorted(self.starts, pointers, side="right") - 1
            end = self.ends[np.clip(slot, 0, None)]
            # The room left after the pointer, never pointer + size: an address near 2**63
            # plus a small size wraps negative in int64 and would pass (then a copy segfaults).
            room = end - np.clip(pointers, 0, None)
            inside = (slot >= 0) & (sizes >= 0) & (sizes <= room)
        else:
            inside = np.zeros(len(pointers), dtype=bool)
        if bool(np.all(inside)):
            return
        bad = int(np.argmin(inside))
        message = (
            f"{owner}: piece {bad} at {int(pointers[bad]):#x} (+{int(sizes[bad])} bytes) lies "
            f"outside every CPU tensor the pool holds ({len(self.starts)} ranges, "
            f"{self.nbytes} bytes); nothing was copied. Only memory of a registered host pool "
            "can be moved (register it with register_mem_pool_host first)"
        )
        raise PoolError(message)
