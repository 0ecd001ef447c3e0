"""Built-in transports: cpu (the default) and memory (checked copies, for tests)."""

from __future__ import annotations

from ..hookspecs import hookimpl
from ..registry import RegisterTransport
from ..transports.cpu import CpuOptions, CpuTransport
from ..transports.memory import MemoryOptions, MemoryTransport

__all__: list[str] = []


@hookimpl
def kvcr_register_transports(register: RegisterTransport) -> None:
    register("cpu", CpuTransport, options=CpuOptions, description="memmove on host threads")
    register(
        "memory", MemoryTransport, options=MemoryOptions, description="checked copies for tests"
    )
