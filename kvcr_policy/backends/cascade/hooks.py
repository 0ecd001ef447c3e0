"""The ``cascade`` backend registers itself, as any plugin does (listed in
:data:`kvcr_policy.plugins.BUILTIN_PLUGINS`; the backend is imported when a pipeline builds
one)."""

from __future__ import annotations

from ...hookspecs import hookimpl
from ...registry import Lazy, RegisterBackend
from ..dram.hooks import transport_capabilities
from .options import CascadeOptions

__all__: list[str] = []


@hookimpl
def kvcr_register_backends(register: RegisterBackend) -> None:
    register(
        "cascade",
        Lazy(f"{__package__}.backend", "CascadeBackend", transport_capabilities, maps_tiers=True),
        options=CascadeOptions,
        description="dram in front of file: demote on eviction, promote on a hit",
    )
