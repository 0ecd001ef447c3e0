"""The ``file`` backend registers itself, as any plugin does: the backend and its benchmark
adapter.

Listed in :data:`kvcr_policy.plugins.BUILTIN_PLUGINS` by name; nothing of the backend but its
options model is imported at registration.
"""

from __future__ import annotations

from typing import Any

from ...hookspecs import hookimpl
from ...registry import Lazy, RegisterBackend, RegisterBenchBackend, Registry
from .options import FileOptions

__all__: list[str] = []


def file_capabilities(config: Any, registry: Registry) -> frozenset[str]:
    """The file tier shapes its own copies: a coalescing strategy has nothing to use."""
    return frozenset()


@hookimpl
def kvcr_register_backends(register: RegisterBackend) -> None:
    register(
        "file",
        Lazy(f"{__package__}.backend", "FileBackend", file_capabilities),
        options=FileOptions,
        description="slot files on a local file system, crash-consistent (backend.options.path)",
    )


@hookimpl
def kvcr_register_bench_backends(register: RegisterBenchBackend) -> None:
    from .bench import FileBench

    register(FileBench)
