"""The ``ucx`` transport name: how a profile says "my tier is a peer's, reached over UCX".

It moves nothing itself and keeps no local tier. ``transport.name = "ucx"`` selects the
``peer`` backend (``backend.name = "auto"``), and ``[transport.options]`` (:class:`UcxOptions`)
configures that backend's UCX worker and connection; the :class:`~.backend.PeerBackend` owns
both. ucxx is imported only when the first pool attaches, on the UCX worker thread, after the
UCX environment knobs of ``[transport.options]`` were applied (see :mod:`.env`); without ucxx
installed the transport still validates and says what to install when it is used.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from kvcr_policy.config.schema import PolicyConfig

from .options import UcxOptions

__all__ = ["CAPABILITIES", "UcxOptions", "UcxTransport", "ucxx_available"]

#: The descriptor shapes the peer accepts (a connected peer may narrow them).
CAPABILITIES = frozenset({"coalesce", "split"})


def ucxx_available() -> bool:
    """Whether the optional dependency ucxx (PyPI ucxx-cu12) can be imported."""
    return importlib.util.find_spec("ucxx") is not None


class UcxTransport:
    """The configured ``ucx`` transport: its options, for the ``peer`` backend to use."""

    name = "ucx"
    #: The backend that ``backend.name = "auto"`` picks for this transport.
    backend = "peer"
    capabilities = CAPABILITIES
    devices = frozenset({"cpu"})

    def __init__(self, config: PolicyConfig, options: UcxOptions) -> None:
        self.config = config
        self.options = options

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "capabilities": sorted(self.capabilities)}

    def close(self) -> None:
        """Nothing to release: the peer backend owns the connection."""
