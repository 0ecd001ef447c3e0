"""Built-in transports: cpu (the default), memory (checked copies, for tests) and cuda."""

from __future__ import annotations

from typing import Any

from ..backends.dram.transports.cpu import CpuOptions, CpuTransport
from ..backends.dram.transports.cuda import CudaOptions
from ..backends.dram.transports.memory import MemoryOptions, MemoryTransport
from ..backends.peer.transport import (  # imports ucxx only when a pool attaches
    UcxOptions,
    UcxTransport,
)
from ..hookspecs import hookimpl
from ..registry import RegisterTransport

__all__: list[str] = []


def _cuda(config: Any, options: CudaOptions) -> Any:
    # torch is imported only when a cuda transport is built, never at plugin registration.
    from ..backends.dram.transports.cuda import CudaTransport

    return CudaTransport(config, options)


@hookimpl
def kvcr_register_transports(register: RegisterTransport) -> None:
    register("cpu", CpuTransport, options=CpuOptions, description="memmove on host threads")
    register(
        "memory", MemoryTransport, options=MemoryOptions, description="checked copies for tests"
    )
    register("cuda", _cuda, options=CudaOptions, description="GPU pools, pinned tier, one stream")
    register("ucx", UcxTransport, options=UcxOptions, description="peer tier over UCX (serve)")
