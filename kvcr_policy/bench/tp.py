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

from ..geometry import PRESETS, PoolGeometry
from .plan import Plan
from .setup import BenchError, BenchSetup
from .targets import CpuTarget, CudaTarget

__all__ = ["check_ranks", "describe_shard", "shard_geometry", "shard_heads"]


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
    full = 1 if plan.setup.mla else int(PRESETS[plan.setup.geometry]["heads"])
    return {
        "kv_heads": full,
        "kv_heads_per_rank": plan.measured.heads,
        "replicated": plan.setup.mla or plan.setup.ranks > full,
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
    target.check_ranks(setup.ranks)
