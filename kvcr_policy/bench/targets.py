"""The target axis: where the engine's pool lives, and how its pages are filled and checked.

A pool object owns the pages of one run: it fills the source pages with a pattern in which
every page differs, remembers one checksum per page, poisons the destination pages before each
restore and verifies every one of them after it.

- ``cpu``: a host pool of 2n pages, as HiCache's host pool: pages are stored from the first n
  and restored into the last n (free pages of the same pool).
- ``cuda``: a GPU pool of n pages; each tier is filled by *offloading* the pool (GPU -> tier)
  and the restore lands in the same pages, so host memory holds only the tiers. Checksums
  are computed on the GPU.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from ..geometry import PoolGeometry
from .setup import BenchError

__all__ = [
    "TARGETS",
    "CpuTarget",
    "CudaTarget",
    "HostPool",
    "Pool",
    "checksums",
    "tokens_of",
    "torch_checksums",
]

# Scratch of a checksum pass: at most about this many bytes of products at a time.
_CHUNK_BYTES = 1 << 26
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # a multiplier that makes every word differ
_POISON = 0xA5


def tokens_of(page_size: int, pages: np.ndarray) -> np.ndarray:
    """The token indices of ``pages`` (``page_size`` consecutive tokens each), in order."""
    return (pages[:, None] * page_size + np.arange(page_size, dtype=np.int64)).reshape(-1)


class Pool(Protocol):
    """The pages of one run; ``tensor`` is what pipelines register as pool ``kv``."""

    geometry: PoolGeometry
    tensor: Any
    src_pages: np.ndarray
    dst_pages: np.ndarray

    def fill(self) -> None: ...

    def poison(self) -> None: ...

    def verify(self) -> bool: ...

    def sync(self) -> None: ...


def _fill(words: np.ndarray) -> None:
    """A cheap pattern (no random generator over GBs) in which every 8-byte word differs."""
    chunk = 1 << 24
    for start in range(0, len(words), chunk):
        stop = min(start + chunk, len(words))
        words[start:stop] = np.arange(start, stop, dtype=np.uint64) * _GOLDEN


def checksums(view: np.ndarray) -> np.ndarray:
    """One 64-bit checksum per page of a ``(planes, pages, fragment bytes)`` uint8 view.

    Each 8-byte word is weighted by its position in the page (wrapping arithmetic), so a
    swapped, shifted, missing or stale fragment changes its page's checksum.
    """
    planes, pages, nbytes = view.shape
    width = nbytes // 8
    out = np.zeros(pages, dtype=np.uint64)
    step = max(1, _CHUNK_BYTES // nbytes)
    for plane in range(planes):
        weights = (np.arange(width, dtype=np.uint64) + np.uint64(plane * width)) * np.uint64(2)
        weights += np.uint64(1)
        for start in range(0, pages, step):
            words = np.ascontiguousarray(view[plane, start : start + step]).view(np.uint64)
            out[start : start + step] += (words * weights).sum(axis=1, dtype=np.uint64)
    return out


def torch_checksums(torch: Any, flat: Any, geometry: PoolGeometry) -> Any:
    """:func:`checksums` of a pool's bytes where they live (the GPU), as int64: the same
    wrapping arithmetic, so the values equal :func:`checksums`' read as uint64."""
    width = geometry.fragment_bytes // 8
    words = flat.view(torch.int64).view(geometry.fragments_per_page, geometry.pages, width)
    out = torch.zeros(geometry.pages, dtype=torch.int64, device=flat.device)
    step = max(1, (_CHUNK_BYTES * 16) // geometry.fragment_bytes)
    position = torch.arange(width, dtype=torch.int64, device=flat.device)
    for plane in range(geometry.fragments_per_page):
        weights = (position + plane * width) * 2 + 1
        for start in range(0, geometry.pages, step):
            stop = min(start + step, geometry.pages)
            out[start:stop] += (words[plane, start:stop] * weights).sum(dim=1)
    return out


class HostPool:
    """A host pool of 2n pages (torch memory, as SGLang allocates it), or one handed in."""

    def __init__(self, geometry: PoolGeometry, tensor: Any = None) -> None:
        import torch

        if tensor is None:
            tensor = torch.empty(geometry.shape, dtype=getattr(torch, geometry.dtype))
        self.geometry = geometry
        self.tensor = tensor
        n = geometry.pages // 2
        self.src_pages = np.arange(n, dtype=np.int64)
        self.dst_pages = n + self.src_pages
        raw = tensor.view(-1).view(torch.uint8).numpy()
        self._raw = raw
        self._view = raw.reshape(geometry.fragments_per_page, geometry.pages, -1)
        self._expected = np.zeros(n, dtype=np.uint64)

    def fill(self) -> None:
        _fill(self._raw.view(np.uint64))
        self._expected = checksums(self._view[:, self.src_pages[0] : self.src_pages[-1] + 1])

    def poison(self) -> None:
        self._view[:, self.dst_pages[0] :] = _POISON

    def verify(self) -> bool:
        got = checksums(self._view[:, self.dst_pages[0] :])
        return bool(np.array_equal(got, self._expected))

    def sync(self) -> None:
        return None


class CpuTarget:
    """Pools in host memory; the profile's transport moves the pages."""

    name = "cpu"
    overrides: Mapping[str, Any] = {}

    def geometry(self, measured: PoolGeometry) -> PoolGeometry:
        """The pool of a run that measures ``measured``: twice its pages."""
        return measured.with_tokens(2 * measured.tokens)

    def check(self, measured: PoolGeometry) -> None:
        return None

    def check_ranks(self, ranks: int, devices: Sequence[int] | None = None) -> None:
        """Any number of ranks share the host (each its own process, pool and tier)."""
        if devices is not None:
            message = (
                "--devices maps ranks to GPUs; the cpu target has none: use --target cuda, or "
                "drop --devices"
            )
            raise BenchError(message)
        return None

    def select(self, device: int) -> None:
        """Nothing to choose for a rank: every host pool is in host memory."""
        return None

    def open(self, measured: PoolGeometry) -> HostPool:
        return HostPool(self.geometry(measured))

    def metadata_pool(self, geometry: PoolGeometry) -> tuple[PoolGeometry, Any]:
        """A small pool of ``geometry`` in host memory, for the metadata measurement."""
        return geometry, np.zeros(geometry.shape, dtype=np.dtype(geometry.dtype))

    def describe(self) -> dict[str, Any]:
        return {}


class GpuPool:
    """A GPU pool of n pages, filled with random words; checksums on the GPU."""

    def __init__(self, torch: Any, geometry: PoolGeometry) -> None:
        self.torch = torch
        self.geometry = geometry
        self.tensor = torch.empty(
            geometry.shape, dtype=getattr(torch, geometry.dtype), device=geometry.device
        )
        self._flat = self.tensor.view(-1).view(torch.uint8)
        self.src_pages = self.dst_pages = np.arange(geometry.pages, dtype=np.int64)
        self._expected: Any = None

    def fill(self) -> None:
        self._flat.view(self.torch.int64).random_()
        self._expected = torch_checksums(self.torch, self._flat, self.geometry)

    def poison(self) -> None:
        self._flat.fill_(_POISON)

    def verify(self) -> bool:
        got = torch_checksums(self.torch, self._flat, self.geometry)
        return bool(self.torch.equal(got, self._expected))

    def sync(self) -> None:
        self.torch.cuda.synchronize()


class CudaTarget:
    """Pools on the current GPU; the tier is pinned and the ``cuda`` transport moves pages."""

    name = "cuda"
    overrides: Mapping[str, Any] = {"transport.name": "cuda"}
    #: GPU memory beside the pool: gather scratch, index arrays, checksum products.
    scratch_bytes = 1 << 30

    def _torch(self) -> Any:
        from ..memory.cuda import require_cuda

        return require_cuda()  # CudaUnavailableError: "no CUDA device visible: ..."

    def geometry(self, measured: PoolGeometry) -> PoolGeometry:
        torch = self._torch()
        return replace(measured, device=f"cuda:{torch.cuda.current_device()}")

    def check(self, measured: PoolGeometry) -> None:
        torch = self._torch()
        free, _ = torch.cuda.mem_get_info()
        needed = measured.nbytes + self.scratch_bytes
        if needed > free:
            message = (
                f"the cuda target needs about {needed / 2**30:.1f} GiB of GPU memory (pool "
                f"{measured.nbytes / 2**30:.1f} GiB, scratch {self.scratch_bytes / 2**30:.0f} "
                f"GiB); {free / 2**30:.1f} GiB is free; lower --tokens"
            )
            raise BenchError(message)

    def check_ranks(self, ranks: int, devices: Sequence[int] | None = None) -> None:
        """One rank per GPU, or the GPUs ``devices`` names (several ranks may share one):
        refuse more ranks than visible GPUs, or an index past them."""
        torch = self._torch()
        visible = torch.cuda.device_count()
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = "" if env is None else f" (CUDA_VISIBLE_DEVICES={env!r})"
        if devices is not None:
            check_devices(devices, visible, shown)
        elif ranks > visible:
            message = (
                f"--ranks {ranks}: one rank runs per GPU, and {visible} CUDA device"
                f"{'s are' if visible != 1 else ' is'} visible{shown}; use --ranks {visible} or "
                "fewer, or make more GPUs visible"
            )
            raise BenchError(message)

    def select(self, device: int) -> None:
        """A rank runs on GPU ``device`` (made current, so its pool is allocated there)."""
        self._torch().cuda.set_device(device)

    def metadata_pool(self, geometry: PoolGeometry) -> tuple[PoolGeometry, Any]:
        """A small pool of ``geometry`` on the current GPU, for the metadata measurement (a
        profile that names the cuda transport moves only GPU memory)."""
        torch = self._torch()
        on_gpu = self.geometry(geometry)
        dtype = getattr(torch, geometry.dtype)
        return on_gpu, torch.zeros(geometry.shape, dtype=dtype, device=on_gpu.device)

    def open(self, measured: PoolGeometry) -> GpuPool:
        return GpuPool(self._torch(), self.geometry(measured))

    def describe(self) -> dict[str, Any]:
        return {
            "device": self._torch().cuda.get_device_name(),
            "fill": "each tier filled by offload from the GPU pool (no host source pool)",
        }


def check_devices(devices: Sequence[int], visible: int, shown: str = "") -> None:
    """Refuse a ``--devices`` index past the ``visible`` GPUs (``shown``: what made them so)."""
    past = [index for index in devices if index >= visible]
    if past:
        listed = ",".join(str(index) for index in devices)
        if visible == 0:
            fix = "make a GPU visible"
        else:
            fix = f"use indices 0..{visible - 1} (e.g. --devices {','.join(['0'] * len(devices))})"
        message = (
            f"--devices {listed}: GPU {past[0]} is not visible; {visible} CUDA device"
            f"{'s are' if visible != 1 else ' is'} visible{shown}; {fix}"
        )
        raise BenchError(message)


TARGETS: Mapping[str, type[CpuTarget] | type[CudaTarget]] = {"cpu": CpuTarget, "cuda": CudaTarget}
