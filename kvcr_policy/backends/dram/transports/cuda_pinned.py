"""Tier regions registered for DMA with the cuda transport: pinning, device views, GPU location.

Pageable host memory moves to a GPU at about a tenth of the PCIe rate, so each tier region is
registered with ``cudaHostRegister`` (portable, mapped) when its pool registers, and unregistered
only after every copy that could touch it has completed (the transport decides when). The
registration gives two views of the region without exporting its buffer: a CPU tensor for
copies and a CUDA tensor over its device mapping for the index kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvcr_policy.errors import TransportError
from kvcr_policy.memory.locality import DeviceLocality, locate, pci_address

__all__ = ["Interface", "Registration", "cuda_locality", "register", "unregister"]

# cudaHostRegisterPortable | cudaHostRegisterMapped (cuda_runtime_api.h): usable from every
# device, and mapped into the device address space so kernels can read it (the gather path).
REGISTER_FLAGS = 0x01 | 0x02


class Interface:
    """Raw memory as ``__array_interface__`` / ``__cuda_array_interface__`` (no buffer export).

    Views made this way hold no export of the tier's mmap, so the region can still unmap once
    the views are dropped (memory.region.Region.close refuses while an export is alive).
    """

    def __init__(self, address: int, nbytes: int) -> None:
        spec = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False), "version": 3}
        self.__array_interface__ = spec
        self.__cuda_array_interface__ = {**spec, "strides": None}


@dataclass
class Registration:
    """One tier region registered for DMA, with its host and device views."""

    address: int
    nbytes: int
    device: int
    seconds: float
    pointer: str
    host: Any = field(repr=False)  # uint8 CPU tensor over the region
    mapped: Any = field(repr=False)  # uint8 CUDA tensor over the same bytes (device mapping)

    def report(self) -> dict[str, Any]:
        return {
            "bytes": self.nbytes,
            "device": f"cuda:{self.device}",
            "seconds": round(self.seconds, 6),
            "gigabytes_per_s": round(self.nbytes / self.seconds / 1e9, 3) if self.seconds else None,
            "flags": "portable|mapped",
            "device_pointer": self.pointer,
        }


def register(torch: Any, cudart: Any, address: int, nbytes: int, device: int) -> Registration:
    """Register ``nbytes`` at ``address`` for DMA on ``device``; the time taken is reported."""
    with torch.cuda.device(device):
        start = time.perf_counter()
        err = cudart.cudaHostRegister(address, nbytes, REGISTER_FLAGS)
        seconds = time.perf_counter() - start
        if int(err) != 0:
            message = (
                f"cudaHostRegister of the {nbytes}-byte tier region failed: "
                f"{cudart.cudaGetErrorString(err)}; lower placement.capacity_bytes or "
                "raise the locked-memory limit (ulimit -l)"
            )
            raise TransportError(message)
        pointer, mapped_address = _device_pointer(address)
        host = torch.from_numpy(np.asarray(Interface(address, nbytes)))
        mapped = torch.as_tensor(Interface(mapped_address, nbytes), device=f"cuda:{device}")
    return Registration(address, nbytes, device, seconds, pointer, host, mapped)


def unregister(cudart: Any, registration: Registration) -> str | None:
    """Drop the views and unregister; the runtime's error string when that failed."""
    registration.host = registration.mapped = None
    status = cudart.cudaHostUnregister(registration.address)
    return None if int(status) == 0 else str(cudart.cudaGetErrorString(status))


def _device_pointer(address: int) -> tuple[str, int]:
    """Where kernels see a registered address: cudaHostGetDevicePointer when cuda-python
    is installed, else the host address itself (unified addressing, 64-bit Linux)."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        return "unified", address
    err, pointer = runtime.cudaHostGetDevicePointer(address, 0)
    if int(err) != 0:
        message = f"cudaHostGetDevicePointer failed for a registered tier region: {err}"
        raise TransportError(message)
    return "cudaHostGetDevicePointer", int(pointer)


def cuda_locality(torch: Any, index: int) -> DeviceLocality:
    """GPU ``index`` and its NUMA node: its PCI address from torch's device properties (the
    same fields ``torch.numa.binding`` reads), its node from sysfs."""
    props = torch.cuda.get_device_properties(index)
    try:  # torch builds without these fields (older ones) leave the GPU unlocated
        ids = [int(getattr(props, f"pci_{name}_id")) for name in ("domain", "bus", "device")]
    except AttributeError:
        return locate(f"cuda:{index}", None)
    return locate(f"cuda:{index}", pci_address(*ids))
