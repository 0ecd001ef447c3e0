"""Resolve a :class:`BenchSetup` into a :class:`~kvcr_policy.bench.plan.Plan`: every input
checked before anything starts.

An unknown geometry, layout, target, backend or peer implementation, a token count that is
not whole pages, a missing optional module (ucxx, sglang), a missing GPU or too little GPU
memory, too little host memory, ``--ranks`` that the model's KV heads cannot be split across
or that exceed the visible GPUs, and a profile or ``--set`` value that does not load are all
refused here with one message (``kvcr-policy bench`` exits 2), before any memory is filled or
any server started.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, cast

from ..config.loading import load_config
from ..geometry import LAYOUTS, Layout, PoolGeometry
from ..memory.headroom import read_headroom
from .backends import bench_backends, default_backend
from .hicache import PEER, HiCacheFileComparison
from .plan import Comparison, Plan
from .setup import BenchError, BenchSetup
from .sglang_mooncake import PEER as SGLANG_MOONCAKE
from .sglang_mooncake import SGLangMooncakeComparison
from .shape import model_shape
from .sides import ProfileComparison
from .targets import TARGETS
from .tp import check_ranks, shard_geometry

__all__ = ["COMPARISONS", "choosing", "resolve"]

#: ``--peer`` names -> the comparison that runs P against that implementation.
COMPARISONS: dict[str, type[Comparison]] = {
    PEER: HiCacheFileComparison,
    SGLANG_MOONCAKE: SGLangMooncakeComparison,
}


def _choice(what: str, value: str, known: Iterable[str]) -> BenchError:
    names = ", ".join(sorted(known))
    return BenchError(f"unknown {what} {value!r}; expected one of: {names}")


def _measured(setup: BenchSetup) -> PoolGeometry:
    shape = model_shape(setup)
    if setup.layout not in LAYOUTS:
        raise _choice("layout", setup.layout, LAYOUTS)
    page = shape.page_size
    if setup.tokens < page or setup.tokens % page:
        whole = max(page, setup.tokens - setup.tokens % page)
        message = (
            f"--tokens: expected whole pages of {setup.geometry!r} ({page} tokens each), got "
            f"{setup.tokens}; try --tokens {whole}"
        )
        raise BenchError(message)
    geometry = shape.pool(cast(Layout, setup.layout), setup.tokens)
    # With --tp (else --ranks), one restore moves one rank's tensor-parallel shard.
    return replace(shard_geometry(geometry, setup.tp or setup.ranks), name="kv")


#: Share of the memory available that a run may plan to fill (the rest: Python, torch, UCX).
_HOST_SHARE = 0.9


def _check_host_memory(plan: Plan) -> None:
    """Refuse a run whose pool and tiers cannot fit in the memory this process can get now
    (:mod:`~kvcr_policy.memory.headroom`: its memory cgroup, the host's MemAvailable, its
    address space), where it would die of ENOMEM, or of the OOM killer, after minutes of
    filling: a host pool of twice the measured pages on the cpu target, a tier of the measured
    pages per side (P and its baseline), and the two buffers of the host memory copy
    (:mod:`.host_copy`)."""
    measured = plan.measured.nbytes
    pool = plan.target.geometry(plan.measured).nbytes if plan.target.name == "cpu" else 0
    needed = pool + 4 * measured
    binding = read_headroom().now()  # the run fills every byte at once, as a pre-fault does
    if binding is None:
        return
    available, limit = binding.available, binding.limit
    if needed > _HOST_SHARE * available:
        page = plan.measured.page_bytes
        fits = int(_HOST_SHARE * available) // ((needed // plan.measured.pages) or 1)
        tokens = max(0, fits) * plan.measured.page_size
        message = (
            f"--tokens {plan.setup.tokens}: the run fills about {needed / 2**30:.1f} GiB of host "
            f"memory (pool {pool / 2**30:.1f} GiB, two tiers and the host copy's two buffers of "
            f"{measured / 2**30:.1f} GiB each; {page} bytes per page); {limit.name} leaves "
            f"{available / 2**30:.1f} GiB ({limit.source}); lower --tokens (at most about "
            f"{tokens}), or {limit.fix}"
        )
        raise BenchError(message)


#: Options that belong to whichever transport or backend a run ends up with: a target (cuda)
#: or a backend (peer: ucx) may change those, so they are checked once the run's are known.
_DEFERRED = ("transport.options.", "backend.options.")


def choosing(target: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The overrides that choose a run's backend: the target's, then ``--set`` less the
    options of a transport or backend not yet chosen (:func:`resolve` checks those after)."""
    kept = {k: v for k, v in (overrides or {}).items() if not k.startswith(_DEFERRED)}
    return {**target, **kept}


def resolve(setup: BenchSetup) -> Plan:
    """Check every input of ``setup`` and pick its target, backend and comparison."""
    counts = (
        ("--repeat", setup.repeat),
        ("exists_keys", setup.exists_keys),
        ("--ranks", setup.ranks),
    )
    for what, value in counts:
        if value < 1:
            raise BenchError(f"{what}: expected a positive count, got {value}")
    measured = _measured(setup)
    if setup.target not in TARGETS:
        raise _choice("target", setup.target, TARGETS)
    target = TARGETS[setup.target]()
    name = setup.backend
    loaded = load_config(
        profile=setup.profile, overrides=choosing(target.overrides, setup.overrides)
    )
    backends = bench_backends(loaded)
    if name is None:
        name = default_backend(loaded, backends)
    if name not in backends:
        raise _choice("backend", name, backends)
    if setup.ranks > 1:  # on cuda: a GPU per rank ("no CUDA device visible" without one)
        check_ranks(setup, name, target)
    elif setup.devices is not None:  # one rank, in this process, on the GPU named
        target.check_ranks(1, setup.devices)
        target.select(setup.devices[0])
    backend = backends[name](setup)
    backend.check()
    comparison: Comparison = ProfileComparison()
    if setup.peer is not None:
        if setup.peer not in COMPARISONS:
            raise _choice("peer implementation", setup.peer, COMPARISONS)
        comparison = COMPARISONS[setup.peer]()
    plan = Plan(setup, measured, target, backend, comparison)
    comparison.check(plan)
    target.check(measured)
    _check_host_memory(plan)
    # Every --set and --vs-set is checked here against the transport and backend the run
    # uses (ConfigError, exit 2, names the bad value and whose options it is).
    for label, profile in plan.profiles.items():
        planned = {
            **target.overrides,
            "placement.capacity_bytes": measured.nbytes,
            **backend.planned(),
            **(setup.overrides or {}),
            **((setup.vs_overrides or {}) if label == "Q" else {}),
        }
        load_config(profile=profile, overrides=planned)
    return plan
