"""``kvcr-policy plan``: the command behind the CLI's options (:mod:`kvcr_policy.cli.plan`
builds a :class:`PlanCommand` and hands it here).

Without ``--trace`` it sizes a tier for ``--tokens``; with ``--trace FILE`` it replays the
requests of a trace at each ``--capacity-tokens`` with each ``--eviction`` strategy. Every
input is checked before any replay starts (exit 2 with one message); refusals exit 2 after
the figures; a ``--bytes`` replay that disagrees with the model exits 1.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from ..config.loading import LoadedConfig, load_config
from ..config.schema import EvictionSection
from ..errors import ArgumentError
from ..model.shape import ShapeOptions, resolve_shape
from .break_even import break_even, gate_options, restore_rates
from .cascade import DiskLevel
from .figures import Given, Plan, make_plan, rank_geometry
from .report import break_even_lines, plan_table
from .request import build_request
from .trace import MAX_BYTES_REQUESTS, MAX_INPUT_TOKENS, Trace, read_trace
from .workload import Eviction, make_trace_plan

__all__ = ["PlanCommand", "run"]

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

#: Most capacities and eviction strategies one command compares.
MAX_LISTED = 64
_CAPACITY = re.compile(r"([0-9]{1,16})([kMG]?)")
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9}
_TRACE_ONLY = ("--capacity-tokens", "--eviction", "--bytes", "--plot", "--block-tokens",
               "--disk-tokens", "--disk-limit")  # fmt: skip


def _listed(text: str, option: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise ArgumentError(f"{option} {text!r}: expected a comma-separated list, no empty item")
    if len(items) > MAX_LISTED:
        raise ArgumentError(f"{option}: at most {MAX_LISTED} items; got {len(items)}")
    twice = sorted({item for item in items if items.count(item) > 1})
    if twice:
        raise ArgumentError(f"{option}: {', '.join(twice)} listed twice; list each once")
    return items


def capacities_given(text: str, option: str = "--capacity-tokens") -> list[Given]:
    """``--capacity-tokens 1000000,3M,10M``: token counts (digits, optional k, M or G)."""
    given = []
    for item in _listed(text, option):
        match = _CAPACITY.fullmatch(item)
        if match is None:
            message = (
                f"{option}: {item!r} is not a token count; expected digits with an "
                "optional k, M or G (1000000, 3M)"
            )
            raise ArgumentError(message)
        given.append(Given(int(match[1]) * _UNITS[match[2]], option))
    return given


def evictions_given(loaded: LoadedConfig, text: str | None) -> list[Eviction]:
    """``--eviction lru,s3fifo`` (each with its defaults, or the configured options when it is
    the configured strategy), else the configured strategy."""
    configured = loaded.config.eviction
    if text is None:
        return [Eviction(configured, loaded.origin("eviction.strategy"))]
    registry = loaded.registry
    assert registry is not None  # every load_config result carries its registry
    chosen = []
    for name in _listed(text, "--eviction"):
        if registry.find("eviction", name) is None:
            names = ", ".join(registry.names("eviction"))
            raise ArgumentError(f"--eviction: no eviction strategy {name!r} (registered: {names})")
        options = configured.options if name == configured.strategy else {}
        chosen.append(Eviction(EvictionSection(strategy=name, options=options), "--eviction"))
    return chosen


def _default_capacity(loaded: LoadedConfig, request: Any, block_tokens: int) -> list[Given]:
    """The configured tier, in whole blocks of tokens (``placement.capacity_bytes``)."""
    from .figures import Plan

    geo = rank_geometry(request, Plan())
    if geo is None:
        return []  # the plan refuses the rank layout itself
    capacity = int(loaded.config.placement.capacity_bytes)
    per_block = -(-block_tokens // geo.page_size) * geo.page_bytes
    tokens = capacity // per_block * block_tokens
    origin = (
        f"placement.capacity_bytes {capacity} (from {loaded.origin('placement.capacity_bytes')})"
    )
    return [Given(tokens, origin)]


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _finish(refusals: list[str]) -> None:
    for refusal in refusals:
        err.print(f"kvcr-policy plan: refused: {refusal}", markup=False, highlight=False)
    if refusals:
        raise typer.Exit(2)


@dataclass(frozen=True, slots=True)
class PlanCommand:
    """One ``kvcr-policy plan`` command line, as typed (None: the option was left out)."""

    profile: str | None = None
    overrides: Mapping[str, str] = field(default_factory=dict)
    #: Without a trace: the tokens the tier should hold, and the prefix whose restore is timed.
    tokens: int | None = None
    prefix_tokens: int | None = None
    #: ``--trace`` and what goes with it; ``plot`` was checked by the command line.
    trace: Path | None = None
    capacity_tokens: str | None = None
    block_tokens: int | None = None
    eviction: str | None = None
    bytes_requests: int | None = None
    plot: str | None = None
    #: ``--trace``: the disk level behind each capacity (tokens, as typed) and its rate (GB/s).
    disk_capacity_tokens: str | None = None
    disk_gbps: float | None = None
    #: The model's page shape (a preset, a config.json or its dimensions; ``tp``), the layout.
    shape: ShapeOptions = field(default_factory=ShapeOptions)
    layout: str = "layer_first"
    #: The deployment: ranks, pools and the host.
    pp: int | None = None
    ranks_per_host: int | None = None
    pools: int | None = None
    host_memory: int | None = None
    link_gbps: float | None = None
    measure_link: bool = False
    json: bool = False
    #: ``--restore-rate NAME=RATE`` each, and ``--prefill-rate`` (tokens/s): break-even rows.
    restore_rates: tuple[str, ...] = ()
    prefill_rate: float | None = None

    def deployment(self) -> dict[str, Any]:
        """The keywords :func:`~.request.build_request` takes besides the shape and tokens."""
        return dict(
            layout=self.layout, tp=self.shape.tp, pp=self.pp, ranks_per_host=self.ranks_per_host,
            pools=self.pools, host_memory=self.host_memory, link_gbps=self.link_gbps,
            measure_link=self.measure_link,
        )  # fmt: skip


def run(command: PlanCommand) -> None:
    """One ``kvcr-policy plan`` command line."""
    loaded = load_config(profile=command.profile, overrides=dict(command.overrides))
    common = command.deployment()
    if command.trace is None:
        values = (command.capacity_tokens, command.eviction, command.bytes_requests,
                  command.plot, command.block_tokens, command.disk_capacity_tokens,
                  command.disk_gbps)  # fmt: skip
        given = [name for name, value in zip(_TRACE_ONLY, values, strict=True) if value is not None]
        if given:
            raise ArgumentError(f"{', '.join(given)} go with --trace FILE (a trace to replay)")
        if command.tokens is None:
            raise ArgumentError("plan needs --tokens N (tokens the tier holds) or --trace FILE")
        request = build_request(
            loaded, shape=resolve_shape(command.shape), tokens=command.tokens,
            prefix_tokens=command.prefix_tokens, **common,
        )  # fmt: skip
        result = make_plan(loaded, request)
        _break_even(loaded, command, result)
        if command.json:
            _print_json({"profile": loaded.profile, **result.to_dict()})
        else:
            title = {"profile": loaded.profile and Path(loaded.profile).stem,
                     "geometry": request.geometry["name"].value}  # fmt: skip
            out.print(plan_table(result, title))
            for line in break_even_lines(result.figures.get("break_even", [])):
                out.print(line, markup=False, highlight=False)
        _finish(result.refusals)
        return
    for value, option in ((command.tokens, "--tokens"), (command.prefix_tokens, "--prefix-tokens")):
        if value is not None:
            raise ArgumentError(f"{option} sizes a tier for a token count; --trace replays a trace")
    bytes_requests = command.bytes_requests
    if bytes_requests is not None and not 1 <= bytes_requests <= MAX_BYTES_REQUESTS:
        raise ArgumentError(f"--bytes: 1..{MAX_BYTES_REQUESTS} requests; got {bytes_requests}")
    _trace_plan(loaded, command.trace, command.block_tokens or 512, command.capacity_tokens,
                command.eviction, bytes_requests, command.plot, command.shape, common,
                command.json, _disk(command))  # fmt: skip


def _disk(command: PlanCommand) -> Given | None:
    """The disk level (``--disk-tokens``, ``--disk-limit``), or None."""
    if command.disk_capacity_tokens is None:
        if command.disk_gbps is not None:
            raise ArgumentError("--disk-limit is the rate of --disk-tokens N: give both")
        return None
    given = capacities_given(command.disk_capacity_tokens, "--disk-tokens")
    if len(given) != 1:
        message = (
            f"--disk-tokens: one disk level behind every DRAM capacity; got "
            f"{len(given)} ({command.disk_capacity_tokens}): give one token count, e.g. 10M"
        )
        raise ArgumentError(message)
    return Given(DiskLevel(given[0].value, command.disk_gbps), "--disk-tokens")


def _break_even(loaded: LoadedConfig, command: PlanCommand, result: Plan) -> None:
    """The break-even row of each backend whose restore rate is known, when a prefill rate is
    (``--prefill-rate`` or the configured gate's): ``figures["break_even"]``."""
    restore = result.figures.get("restore")
    geometry = result.figures.get("geometry")
    if restore is None or geometry is None:
        return
    config = loaded.config
    registry = loaded.registry
    backend = config.backend.name
    if registry is not None:
        backend = registry.backend_for(backend, config.transport.name)
    rates = restore_rates(
        backend, restore.get("link_gigabytes_per_s"),
        restore.get("link_from"), command.restore_rates,
    )  # fmt: skip
    options = gate_options(loaded, command.prefill_rate)
    if not rates:
        return
    if options.prefill_tokens_per_s is None and not options.prefill_curve:
        if not command.restore_rates:
            return  # nobody asked: a plan without a gate or rates says nothing of it
        result.warnings.append(
            "no break-even without a prefill rate: give --prefill-rate TOKENS_PER_S or "
            "configure admission.options.prefill_tokens_per_s"
        )
        return
    up_to = command.prefix_tokens or command.tokens or geometry["page_size"]
    result.figures["break_even"] = [
        break_even(name, rate, origin, geometry["page_size"], geometry["bytes_per_page_rank"],
                   up_to, options).to_dict()
        for name, rate, origin in rates
    ]  # fmt: skip


def _trace_plan(
    loaded: LoadedConfig,
    path: Path,
    block_tokens: int,
    capacity_tokens: str | None,
    eviction: str | None,
    bytes_requests: int | None,
    plot: str | None,
    shape: ShapeOptions,
    common: dict[str, Any],
    json_format: bool,
    disk: Given | None = None,
) -> None:
    capacities = capacities_given(capacity_tokens) if capacity_tokens is not None else None
    evictions = evictions_given(loaded, eviction)
    trace = read_trace(path, block_tokens)
    widest = min(max(trace.inputs), MAX_INPUT_TOKENS)
    request = build_request(
        loaded, shape=resolve_shape(shape, default="qwen3-32b"), tokens=widest,
        prefix_tokens=widest, **common,
    )  # fmt: skip
    if capacities is None:
        capacities = _default_capacity(loaded, request, block_tokens)
    result = make_trace_plan(loaded, request, trace, capacities, evictions, disk)
    if bytes_requests is not None and not result.refusals:
        result.figures["bytes_replays"] = _bytes(loaded, trace.head(bytes_requests), capacities,
                                                 evictions)  # fmt: skip
    if json_format:
        _print_json({"profile": loaded.profile, **result.to_dict()})
    elif not result.refusals:
        from .workload_report import trace_tables

        out.print(trace_tables(result))
    if plot is not None and not result.refusals:
        from .curve import write_curve

        write_curve(result.figures, plot)
    _finish(result.refusals)
    if any(not found["agrees"] for found in result.figures.get("bytes_replays", [])):
        err.print("kvcr-policy plan: the replay with real bytes differs from the model",
                  markup=False, highlight=False)  # fmt: skip
        raise typer.Exit(1)


def _bytes(
    loaded: LoadedConfig, trace: Trace, capacities: list[Given], evictions: list[Eviction]
) -> list[dict[str, Any]]:
    from .replay_bytes import replay_bytes

    found = []
    for chosen in evictions:
        for given in sorted(capacities, key=lambda g: g.value):
            blocks = given.value // trace.block_tokens
            result = replay_bytes(loaded, trace, blocks, chosen.section)
            found.append({"eviction": chosen.name, "capacity_tokens": given.value,
                          **result.to_dict()})  # fmt: skip
    return found
