"""The memory transport: a plain, checked in-process copy, for tests and plugin authors.

Like httpx's MockTransport, it lets a test decide what happens to each batch: ``fault`` is
called before every copy and may raise to simulate a failure, or cut the batch short to
simulate a transfer that died part-way (the bytes before the cut really arrive).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict

from kvcr_policy.config.schema import PolicyConfig
from kvcr_policy.errors import TransportError

from .base import CopyBatch, Transport, check_bounds

__all__ = ["MemoryTransport"]

#: ``fault(batch)`` returns None to copy everything, or how many descriptors to copy before
#: failing; or it raises.
Fault = Callable[[CopyBatch], "int | None"]


class MemoryOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class MemoryTransport(Transport):
    """Copies descriptor by descriptor in the calling thread; faults can be injected."""

    name = "memory"
    capabilities = frozenset({"coalesce", "split"})

    def __init__(
        self,
        config: PolicyConfig | None = None,
        options: MemoryOptions | None = None,
        *,
        fault: Fault | None = None,
    ) -> None:
        super().__init__(workers=1)
        self.fault = fault
        self.batches = 0

    def copy(self, batch: CopyBatch) -> None:
        check_bounds(batch)
        self.batches += 1
        d = batch.descriptors
        stop = self.fault(batch) if self.fault is not None else None
        count = len(d) if stop is None else min(stop, len(d))
        for s, t, n in zip(
            d.src[:count].tolist(), d.dst[:count].tolist(), d.length[:count].tolist(), strict=True
        ):
            ctypes.memmove(batch.dst.address + t, batch.src.address + s, n)
        if count < len(d):
            message = f"memory transport: injected failure after {count} of {len(d)} descriptors"
            raise TransportError(message)
