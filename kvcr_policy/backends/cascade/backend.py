"""The ``cascade`` backend: a ``dram`` backend in front of a ``file`` backend, one pool tier
(:class:`.pool.CascadePool`) over both per pool. DRAM takes ``placement.capacity_bytes`` and
the copy transport, the disk level ``backend.options.file``."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import mismatch
from ..base import BackendContext, PoolSpec
from ..dram.backend import DramBackend
from ..file.backend import FileBackend
from .options import CascadeOptions
from .pool import CascadePool
from .transfer import CascadeRead, CascadeWrite

__all__ = ["CascadeBackend", "CascadeTier"]


class CascadeTier(CascadePool):
    """The :class:`~..base.PoolTier` of ``cascade``."""

    def read(self, keys: list[str], pages: np.ndarray) -> CascadeRead:
        return CascadeRead(self, keys, pages)

    def write(self, keys: list[str], pages: np.ndarray) -> Any:
        """A set of more new keys than DRAM holds sends its leading keys (those that would
        leave DRAM within the set itself) straight to disk."""
        room = self.front.store.capacity
        if self.new_keys(keys) > room:
            return CascadeWrite(self, keys, pages, len(keys) - room)
        return super().write(keys, pages)


class CascadeBackend:
    """The built-in ``cascade`` backend; see the module docstring."""

    name = "cascade"

    def __init__(self, context: BackendContext, options: CascadeOptions) -> None:
        self.front = DramBackend(context, None)
        if getattr(self.front.transport, "whole_slots", False):
            message = (
                "backend 'cascade' demotes pages from a DRAM tier laid out as its pool; the "
                "transport keeps whole slots: choose transport.name = 'cpu'"
            )
            raise mismatch("transport.name", context.loaded.origin("transport.name"), message)
        try:
            self.back = FileBackend(context, options.file)
        except BaseException:
            self.front.close()
            raise
        self.options = options
        self.capabilities = self.front.capabilities
        self.devices = self.front.devices & self.back.devices

    def attach(self, spec: PoolSpec) -> CascadeTier:
        front = self.front.attach(spec)
        back = self.back.attach(spec)
        return CascadeTier(spec.name, front, back, self.options.admit_hits, self.options.promote)

    def describe(self) -> dict[str, Any]:
        return {"name": "cascade", "dram": self.front.describe(), "file": self.back.describe()}

    def close(self) -> None:
        try:
            self.back.close()
        finally:
            self.front.close()
