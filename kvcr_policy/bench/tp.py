"""The tensor-parallel axis: the shard of the pool one of N ranks holds, and what N ranks need.

SGLang runs one process per tensor-parallel rank, and each rank's KV pool holds its share of
the KV heads, as its ``QKVParallelLinear`` splits them (sglang/srt/layers/linear.py): with N
ranks and H KV heads, each rank holds H/N heads when N <= H (N must divide H), and one head,
replicated on N/H ranks, when N > H (H must divide N). An MLA pool has one latent head that
every rank holds whole (replicated), as SGLang keeps MLA KV on every rank.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..geometry import PoolGeometry
from .plan import Plan
from .setup import BenchError, BenchSetup
from .shape import model_shape
from .targets import CpuTarget, CudaTarget

__all__ = [
    "check_ranks",
    "describe_shard",
    "device_of",
    "parse_devices",
    "shard_geometry",
    "shard_heads",
]


def shard_heads(heads: int, ranks: int, *, name: str = "the model") -> int:
    """KV heads per rank of ``heads`` split across ``ranks`` (see the module docstring)."""
    if ranks < 1:
        raise BenchError(f"--ranks: expected a positive count, got {ranks}")
    if ranks <= heads and heads % ranks == 0:
        return heads // ranks
    if ranks > heads and ranks % heads == 0:
        return 1
    divisors = [n for n in range(1, heads + 1) if heads % n == 0]
    choices = ", ".join(str(n) for n in divisors)
    message = (
        f"--ranks {ranks}: {name} has {heads} KV heads, which tensor parallelism cannot split "
        f"across {ranks} ranks (the ranks must divide the heads, or the heads the ranks); "
        f"use --ranks {choices}, or a multiple of {heads}"
    )
    raise BenchError(message)


def shard_geometry(geometry: PoolGeometry, ranks: int) -> PoolGeometry:
    """The pool one rank holds: its share of the KV heads; an MLA pool whole."""
    if geometry.mla or ranks == 1:
        return geometry
    return replace(geometry, heads=shard_heads(geometry.heads, ranks, name=repr(geometry.name)))


def describe_shard(plan: Plan) -> dict[str, Any]:
    """The JSON's ``shard``: KV heads in the model and per rank, and whether ranks replicate."""
    full = model_shape(plan.setup).heads
    return {
        "kv_heads": full,
        "kv_heads_per_rank": plan.measured.heads,
        "replicated": plan.setup.mla or (plan.setup.tp or plan.setup.ranks) > full,
    }


def check_ranks(setup: BenchSetup, backend: str, target: CpuTarget | CudaTarget) -> None:
    """Refuse what a multi-rank run cannot do, before any process starts or module is checked."""
    if setup.peer is not None:
        message = (
            f"--ranks {setup.ranks} compares two profiles on every rank; --peer {setup.peer} "
            "runs in one process: drop --peer or --ranks"
        )
        raise BenchError(message)
    if backend != "dram":
        message = (
            f"--ranks {setup.ranks} gives every rank its own process-owned tier (backend "
            f"'dram'); backend {backend!r} is not supported with --ranks: use --backend dram"
        )
        raise BenchError(message)
    target.check_ranks(setup.ranks, setup.devices)


def parse_devices(text: str | None, ranks: int) -> tuple[int, ...] | None:
    """``--devices LIST``: one GPU index per rank, comma-separated (``0,0``: two ranks on GPU
    0); None when not given. Indices are checked against the visible GPUs by the target."""
    if text is None:
        return None
    items = [item.strip() for item in text.split(",")]
    bad = [item for item in items if not item.isdigit()]
    if bad:
        message = (
            f"--devices {text!r}: expected GPU indices separated by commas (e.g. --devices 0,0 "
            f"for two ranks on GPU 0), got {bad[0]!r}"
        )
        raise BenchError(message)
    if len(items) != ranks:
        message = (
            f"--devices {text}: names {len(items)} GPU{'s' if len(items) != 1 else ''} for "
            f"--ranks {ranks}; give one index per rank (e.g. --devices "
            f"{','.join(['0'] * ranks)} runs every rank on GPU 0)"
        )
        raise BenchError(message)
    return tuple(int(item) for item in items)


def device_of(setup: BenchSetup, rank: int) -> int:
    """The GPU index rank ``rank`` runs on: ``--devices``, else its own number."""
    return rank if setup.devices is None else setup.devices[rank]
