"""How the bytes of one host-pool page are reached when kvcr_policy does not model its layout.

SGLang 0.5.23 gives every host pool two ways to describe a page, and both are used here, in this
order of preference:

- :class:`PointerPages`: ``get_page_buffer_meta(token_indices) -> (pointers, sizes)``, the lists
  SGLang's zero-copy backends (Mooncake, NIXL) move. A page is the concatenation of its pieces;
  every piece is checked against the pool's own tensors (:class:`.memory.MemoryMap`) and every
  page must add up to the size page 0 had, so a pool that answers inconsistently is refused
  instead of copied from.
- :class:`TensorPages`: ``get_data_page(index, flat=True)`` and
  ``set_from_flat_data_page(index, tensor)``, the path ``HiCacheFile`` takes (one tensor per
  page, copied by torch, bounds-checked by torch).

Both copy a page between the pool and one row of a staging buffer (:mod:`.staged`), its pieces
end to end (:func:`~kvcr_policy.backends.staging.packed`); ``index`` is a page's first token
index, as SGLang passes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ...backends.host_copy import copy_descriptors
from ...backends.staging import packed
from ...descriptors import Descriptors
from ...errors import PoolError
from .memory import MemoryMap

__all__ = ["PageAccess", "PointerPages", "TensorPages", "flat_pieces"]

Int64Array = npt.NDArray[np.int64]


#: Largest address or size taken: int64's, in which every later check runs.
_MAX_INT = (1 << 63) - 1


def flat_pieces(meta: Any) -> tuple[Int64Array, Int64Array]:
    """``(pointers, sizes)`` as int64 arrays; nested lists (one list per object, as Mooncake's
    multi-buffer form has them) are flattened in order."""
    if meta is None:
        raise PoolError("get_page_buffer_meta returned None (a pool without page memory)")
    pointers, sizes = meta

    def flat(values: Any, what: str) -> Int64Array:
        out: list[int] = []
        for value in values:
            if isinstance(value, (list, tuple)):
                out.extend(int(v) for v in value)
            else:
                out.append(int(value))
        # Checked as Python ints: numpy would refuse 2**63 with a bare OverflowError.
        bad = next((v for v in out if not 0 <= v <= _MAX_INT), None)
        if bad is not None:
            message = f"get_page_buffer_meta listed {what} {bad}, outside 0..2**63-1"
            raise PoolError(message)
        return np.array(out, dtype=np.int64)

    return flat(pointers, "a pointer"), flat(sizes, "a size")


@dataclass(frozen=True)
class PageAccess:
    """What every access knows: the pool, its token page size and the bytes of one page."""

    pool: Any
    label: str
    page_size: int
    page_bytes: int

    def starts(self, token_indices: torch.Tensor) -> list[int]:
        """The first token index of each page."""
        return [int(i) for i in token_indices[:: self.page_size].tolist()]

    def gather(self, token_indices: torch.Tensor, staging: npt.NDArray[np.uint8]) -> None:
        """Copy the pages at ``token_indices`` into the leading rows of ``staging``."""
        raise NotImplementedError

    def scatter(self, token_indices: torch.Tensor, staging: npt.NDArray[np.uint8]) -> None:
        """Copy the leading rows of ``staging`` into the pages at ``token_indices``."""
        raise NotImplementedError


@dataclass(frozen=True)
class PointerPages(PageAccess):
    """A page as ``get_page_buffer_meta`` lists it: ``pieces`` runs of the given sizes."""

    sizes: Int64Array  # one page's piece sizes, from page 0
    memory: MemoryMap

    @classmethod
    def probe(cls, pool: Any, label: str, page_size: int) -> PointerPages:
        pointers, sizes = flat_pieces(pool.get_page_buffer_meta(_first_page(page_size)))
        memory = MemoryMap.of(pool)
        if not len(sizes) or int(sizes.sum()) <= 0:
            raise PoolError(f"{label}: get_page_buffer_meta lists no bytes for page 0")
        memory.check(label, pointers, sizes)
        return cls(pool, label, page_size, int(sizes.sum()), sizes, memory)

    def pieces(self, token_indices: torch.Tensor) -> tuple[Int64Array, Int64Array]:
        pointers, sizes = flat_pieces(self.pool.get_page_buffer_meta(token_indices))
        pages, per_page = len(token_indices) // self.page_size, len(self.sizes)
        if len(pointers) != pages * per_page or len(sizes) != len(pointers):
            message = (
                f"{self.label}: get_page_buffer_meta listed {len(pointers)} pointers and "
                f"{len(sizes)} sizes for {pages} pages; expected {per_page} per page, as for "
                "page 0. Nothing was copied"
            )
            raise PoolError(message)
        totals = sizes.reshape(pages, per_page).sum(axis=1)
        if pages and not bool(np.all(totals == self.page_bytes)):
            bad = int(np.argmax(totals != self.page_bytes))
            message = (
                f"{self.label}: page {bad} of the call lists {int(totals[bad])} bytes; page 0 "
                f"had {self.page_bytes}. Nothing was copied"
            )
            raise PoolError(message)
        self.memory.check(self.label, pointers, sizes)
        return pointers, sizes

    def gather(self, token_indices: torch.Tensor, staging: npt.NDArray[np.uint8]) -> None:
        pointers, sizes = self.pieces(token_indices)
        # Each page's pieces add up to one row (pieces() checked it): end to end is row by row.
        plan = Descriptors.from_arrays(pointers, packed(sizes), sizes)
        copy_descriptors(_address(staging), 0, plan)

    def scatter(self, token_indices: torch.Tensor, staging: npt.NDArray[np.uint8]) -> None:
        pointers, sizes = self.pieces(token_indices)
        plan = Descriptors.from_arrays(packed(sizes), pointers, sizes)
        copy_descriptors(0, _address(staging), plan)


@dataclass(frozen=True)
class TensorPages(PageAccess):
    """A page as ``get_data_page`` returns it and ``set_from_flat_data_page`` takes it back."""

    dtype: torch.dtype

    @classmethod
    def probe(cls, pool: Any, label: str, page_size: int) -> TensorPages:
        page = pool.get_data_page(0, flat=True)
        if not isinstance(page, torch.Tensor) or page.numel() == 0:
            raise PoolError(f"{label}: get_data_page(0) holds no bytes")
        if not callable(getattr(pool, "set_from_flat_data_page", None)):
            raise PoolError(f"{label}: it has get_data_page but no set_from_flat_data_page")
        return cls(pool, label, page_size, page.numel() * page.element_size(), page.dtype)

    def _row(self, staging: npt.NDArray[np.uint8], row: int) -> torch.Tensor:
        start = row * self.page_bytes
        return torch.from_numpy(staging[start : start + self.page_bytes])

    def gather(self, token_indices: torch.Tensor, staging: npt.NDArray[np.uint8]) -> None:
        for row, start in enumerate(self.starts(token_indices)):
            page = self.pool.get_data_page(start, flat=True).contiguous().view(torch.uint8)
            if page.numel() != self.page_bytes:
                message = (
                    f"{self.label}: get_data_page({start}) has {page.numel()} bytes; page 0 "
                    f"had {self.page_bytes}. Nothing was stored"
                )
                raise PoolError(message)
            self._row(staging, row).copy_(page.reshape(-1))

    def scatter(self, token_indices: torch.Tensor, staging: npt.NDArray[np.uint8]) -> None:
        for row, start in enumerate(self.starts(token_indices)):
            self.pool.set_from_flat_data_page(start, self._row(staging, row).view(self.dtype))


def _first_page(page_size: int) -> torch.Tensor:
    return torch.arange(page_size, dtype=torch.int64)


def _address(array: npt.NDArray[np.uint8]) -> int:
    return int(array.__array_interface__["data"][0])
