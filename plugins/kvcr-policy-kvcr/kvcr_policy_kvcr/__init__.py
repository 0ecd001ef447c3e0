"""kvcr-policy-kvcr: the KVCR runner (``kvcr`` 0.1.1) as a kvcr_policy tier backend.

SGLang HiCache -> kvcr_policy -> KVCR: select it with ``[backend] name = "kvcr"`` in a profile
(or ``KVCR_POLICY_BACKEND__NAME=kvcr``); its options go in ``[backend.options]``
(:class:`~kvcr_policy_kvcr.options.KvcrOptions`). kvcr_policy finds this module through the
``kvcr_policy`` entry-point group (name ``kvcr``). The runner itself is imported only when a
pipeline builds the backend, so profiles naming it validate where ``kvcr`` is not installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvcr_policy.plugin_api import PluginError, hookimpl

from .options import KvcrOptions

if TYPE_CHECKING:
    from kvcr_policy.plugin_api import BackendContext, RegisterBackend, RegisterBenchBackend

__all__ = ["KvcrOptions", "kvcr_register_backends", "kvcr_register_bench_backends"]

INSTALL = "pip install kvcr-policy-kvcr (it pulls kvcr==0.1.1 and nixl)"


def _backend(context: BackendContext, options: KvcrOptions) -> Any:
    try:
        from .agent import load_nixl

        # before kvcr imports it: NIXL's own logging would print on stdout
        load_nixl(context.config.observability.native_logs)
        from .backend import KvcrBackend
    except ImportError as err:
        message = f"backend 'kvcr' needs the KVCR runner, which does not import ({err}); {INSTALL}"
        raise PluginError(message, plugin="kvcr", distribution="kvcr-policy-kvcr") from err
    return KvcrBackend(context, options)


@hookimpl
def kvcr_register_backends(register: RegisterBackend) -> None:
    register(
        "kvcr",
        _backend,
        options=KvcrOptions,
        description="the KVCR runner's local DRAM (and G3 files), over NIXL",
    )


@hookimpl
def kvcr_register_bench_backends(register: RegisterBenchBackend) -> None:
    from .bench import KvcrBench

    register(KvcrBench)
