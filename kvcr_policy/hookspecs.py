"""Every ``kvcr_*`` hook of kvcr_policy, typed and documented.

Hooks run at build time, never per page: a plugin *registers* named factories through the
``register`` callback it is handed, and the pipeline then calls the plain objects those
factories return (a pluggy hook call costs about a microsecond; a page batch must not pay it).
Built-in strategies are plugins registered through the same call as third-party ones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .registry import (
        RegisterBackend,
        RegisterBenchBackend,
        RegisterStrategy,
        RegisterTransport,
    )

__all__ = ["PROJECT", "hookimpl", "hookspec"]

PROJECT = "kvcr_policy"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def kvcr_register_strategies(register: RegisterStrategy) -> None:
    """Register named strategies by calling ``register(kind, name, factory, options=...)``.

    Called by :func:`kvcr_policy.plugins.make_plugin_manager` once per plugin, when a manager is
    built (so the registry knows which plugin and distribution provided each name). All
    implementations are called; return values are ignored. ``kind`` is one of ``batching``,
    ``coalescing``, ``placement``, ``thread_tuning``, ``fallback``, ``eviction``, ``admission``.
    ``factory(section, options)`` receives the frozen config section and the validated options
    model and returns the strategy object (the protocols are in :mod:`kvcr_policy.strategies`;
    an eviction strategy makes one :class:`~kvcr_policy.strategies.EvictionPolicy` per store,
    which the store calls directly, page by page; an admission strategy's ``admit`` runs once
    per lookup, on the pipeline's live restore figures); ``options`` is a pydantic model
    (unknown keys should be forbidden) that validates the section's ``options`` table.
    Registering a name twice is an error naming both plugins.
    """


@hookspec
def kvcr_register_transports(register: RegisterTransport) -> None:
    """Register named transports by calling ``register(name, factory, options=...)``.

    Called by :func:`kvcr_policy.plugins.make_plugin_manager` once per plugin, when a manager is
    built. All implementations are called; return values are ignored. ``factory(config,
    options)`` receives the whole frozen :class:`~kvcr_policy.config.schema.PolicyConfig` and the
    validated options of ``[transport.options]`` and returns the configured transport a backend
    receives (:class:`~kvcr_policy.backends.base.ConfiguredTransport`): a copy engine of the
    ``dram`` backend, or the options of another backend's connection (``ucx``: the ``peer``
    backend). A backend registers the transports it works with from its own hooks module
    (``kvcr_policy.backends.dram.hooks``: ``cpu``, ``cuda``, ``memory``).
    """


@hookspec
def kvcr_register_backends(register: RegisterBackend) -> None:
    """Register named tier backends by calling ``register(name, factory, options=...)``.

    Called by :func:`kvcr_policy.plugins.make_plugin_manager` once per plugin, when a manager is
    built. All implementations are called; return values are ignored. ``factory(context,
    options)`` receives a :class:`~kvcr_policy.backends.base.BackendContext` (the loaded config,
    the resolved placement strategy and the configured transport object) and the validated
    options of ``[backend.options]``, and returns an object implementing
    :class:`kvcr_policy.backends.base.TierBackend`. It is called once per pipeline, by
    :func:`kvcr_policy.pipeline.build_pipeline`, when ``backend.name`` names it (or ``auto``
    resolves to it).
    """


@hookspec
def kvcr_register_bench_backends(register: RegisterBenchBackend) -> None:
    """Register the benchmark adapters of tier backends by calling ``register(adapter)``.

    Called by ``kvcr-policy bench`` only (:func:`kvcr_policy.bench.backends.bench_backends`),
    when a run resolves its backend, never by a pipeline. All implementations are called;
    return values are ignored. ``adapter`` is a subclass of
    :class:`kvcr_policy.bench_adapter.BenchBackend` whose ``name`` is the ``--backend`` that
    selects it (by convention the tier backend's name): the targets it serves, the modules it
    needs, how it starts one instance per side and measures its limit. Registering a name that
    another adapter holds is a :class:`~kvcr_policy.errors.BenchError` naming both modules.
    """


@hookspec
def kvcr_pipeline_opened(pipeline: Any) -> None:
    """Notification: a pipeline finished opening (strategies resolved, thread tuning applied).

    Called by :func:`kvcr_policy.pipeline.build_pipeline` once, after the pipeline is usable.
    All implementations are called; return values are ignored; an exception is logged and
    ignored, so an observer can never break the data path.
    """


@hookspec
def kvcr_pipeline_closed(pipeline: Any, stats: dict[str, Any]) -> None:
    """Notification: a pipeline closed; ``stats`` is its final :meth:`Pipeline.stats` as a dict.

    Called by :meth:`kvcr_policy.pipeline.Pipeline.close` once, after in-flight transfers ended
    and thread tuning was restored. All implementations are called; return values are ignored;
    exceptions are logged and ignored.
    """
