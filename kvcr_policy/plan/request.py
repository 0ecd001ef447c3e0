"""build_request: the plan's inputs from command-line values, each with its origin.

A value given on the command line has the option as its origin (``--tp``); one left out has
its default spelled out (``default: tp x pp``); the host's memory, unless given, is the least of
``MemTotal`` and the memory cgroup's limits (:mod:`~kvcr_policy.memory.headroom`); the link
limit comes from ``--link-limit``, else the configuration (``observability.link_limit_gbps``),
else a measurement when ``--measure-link`` asks for one.
"""

from __future__ import annotations

from typing import Any

from ..config.loading import LoadedConfig
from ..config.rates import MAX_LINK_GBPS, MIN_LINK_GBPS
from ..errors import ArgumentError
from ..model.shape import ModelShape
from .figures import Given, PlanRequest, geometry_given

__all__ = ["build_request"]

_MEASURE_BYTES = 1 << 30  # at most 1 GiB per probe: long enough to be a rate, short to run


def _given(value: Any, option: str, default: Any) -> Given:
    if value is None:
        return Given(default, f"default ({default})")
    return Given(value, option)


def build_request(
    loaded: LoadedConfig,
    *,
    shape: ModelShape,
    layout: str,
    tp: int | None,
    pp: int | None,
    ranks_per_host: int | None,
    pools: int | None,
    tokens: int,
    prefix_tokens: int | None,
    host_memory: int | None,
    link_gbps: float | None,
    measure_link: bool,
) -> PlanRequest:
    """The :class:`PlanRequest` of one ``kvcr-policy plan`` command line."""
    from ..memory.headroom import read_headroom

    fields = geometry_given(shape, Given(layout, "--layout"))
    tp_given, pp_given = _given(tp, "--tp", 1), _given(pp, "--pp", 1)
    ranks = ranks_per_host
    ranks_given = (
        Given(ranks, "--ranks-per-host")
        if ranks is not None
        else Given(tp_given.value * pp_given.value, "default: tp x pp, every rank on one host")
    )
    if host_memory is not None:
        host = Given(host_memory, "--host-memory")
    elif (binding := read_headroom().host()) is not None:
        limit = binding.limit  # MemTotal, or a memory cgroup's limit where that is less
        host = Given(binding.available, f"this machine's {limit.total_name} ({limit.source})")
    else:
        host = Given(None, "unknown: /proc/meminfo and the memory cgroup unreadable")
    if prefix_tokens is not None and prefix_tokens > tokens:
        message = (
            f"--prefix-tokens {prefix_tokens} is more than the {tokens} tokens the tier holds "
            "(--tokens): a restored prefix is part of what the tier holds; lower it or raise "
            "--tokens"
        )
        raise ArgumentError(message)
    request = PlanRequest(
        geometry=fields,
        tp=tp_given,
        pp=pp_given,
        ranks_per_host=ranks_given,
        pools=_given(pools, "--pools", 1),
        tokens=Given(tokens, "--tokens"),
        prefix_tokens=_given(prefix_tokens, "--prefix-tokens", tokens),
        host_memory=host,
        link_gbps=Given(None, "none"),
    )
    return _with_link(loaded, request, link_gbps, measure_link)


def _with_link(
    loaded: LoadedConfig, request: PlanRequest, gbps: float | None, measure: bool
) -> PlanRequest:
    from dataclasses import replace

    if gbps is not None:
        # NaN fails both comparisons too; the bounds are observability.link_limit_gbps's.
        if not MIN_LINK_GBPS <= gbps <= MAX_LINK_GBPS:
            message = (
                f"--link-limit: expected a rate in GB/s from {MIN_LINK_GBPS} to {MAX_LINK_GBPS}, "
                f"got {gbps}"
            )
            raise ArgumentError(message)
        return replace(request, link_gbps=Given(gbps, "--link-limit"))
    configured = loaded.config.observability.link_limit_gbps
    if configured is not None:
        origin = loaded.origin("observability.link_limit_gbps")
        return replace(request, link_gbps=Given(configured, origin))
    if not measure:
        return request
    from .figures import Plan, rank_geometry
    from .link import measure_link

    geometry = rank_geometry(request, Plan())
    if geometry is None:
        return request  # the plan refuses the rank layout itself
    nbytes = min(_MEASURE_BYTES, max(geometry.page_bytes, request.prefix_tokens.value *
                                     geometry.token_bytes))  # fmt: skip
    measured = measure_link(loaded, geometry, nbytes)
    origin = f"measured here: best of 3 probes of {nbytes} bytes with this profile"
    return replace(request, link_gbps=Given(measured, origin))
