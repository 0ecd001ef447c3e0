"""kvcr-policy-mooncake: Mooncake Store as a kvcr_policy tier backend (``mooncake``).

Pages live in Mooncake Store segments across hosts, placed by the master; they move with the
Mooncake transfer engine (tcp or RDMA) straight between the engine's registered pool and the
segments. kvcr_policy finds this module through the ``kvcr_policy`` entry-point group (name
``mooncake``); choose the backend with ``[backend] name = "mooncake"`` and its
``[backend.options]`` (:class:`~.options.MooncakeOptions`). Mooncake itself is imported only
when a backend is built, so profiles validate where it is not installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcr_policy.plugin_api import Lazy, hookimpl

from .options import MooncakeOptions

if TYPE_CHECKING:
    from kvcr_policy.plugin_api import RegisterBackend, RegisterBenchBackend

__all__ = ["MooncakeOptions", "kvcr_register_backends", "kvcr_register_bench_backends"]


@hookimpl
def kvcr_register_backends(register: RegisterBackend) -> None:
    register(
        "mooncake",
        Lazy(f"{__package__}.backend", "MooncakeBackend"),
        options=MooncakeOptions,
        description="Mooncake Store segments across hosts (master-placed; tcp or RDMA)",
    )


@hookimpl
def kvcr_register_bench_backends(register: RegisterBenchBackend) -> None:
    from .bench import MooncakeBench

    register(MooncakeBench)
